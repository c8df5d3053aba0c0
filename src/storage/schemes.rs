//! The object stores by URL scheme: the one registration of a store. A new store is one file
//! (its [`Scheme`](super::s3::Scheme): its name and its client from the environment) plus its
//! line in [`OBJECT_STORES`]; every call site asks [`is_object_store`], [`object_scheme`] or
//! the sink's [`Capabilities`](super::Capabilities), never a scheme itself.

use std::path::Path;

use super::paced::Paced;
use super::s3::{self, Objects};
use super::{azure, gcs, scheme, Source};

/// The object stores, each served by the shared code of [`s3`] with its own client.
pub static OBJECT_STORES: [Objects; 3] =
    [Objects(&s3::S3), Objects(&gcs::GCS), Objects(&azure::AZURE)];

/// [`OBJECT_STORES`], each wrapped in [`Paced`], in the same order.
pub(super) static PACED_OBJECT_STORES: [Paced<Objects>; 3] = [
    Paced(&OBJECT_STORES[0]),
    Paced(&OBJECT_STORES[1]),
    Paced(&OBJECT_STORES[2]),
];

/// Which of [`OBJECT_STORES`] holds `path`, by its scheme.
pub(super) fn object_store(path: &Path) -> Option<usize> {
    let name = scheme(path)?;
    OBJECT_STORES.iter().position(|o| o.0.name == name)
}

/// Whether `path` names object storage (`s3://…`, `gs://…`, `az://…`).
pub fn is_object_store(path: &Path) -> bool {
    object_store(path).is_some()
}

/// The object store that holds `path`, if one does.
pub(crate) fn objects(path: &Path) -> Option<&'static Objects> {
    object_store(path).map(|i| &OBJECT_STORES[i])
}

/// The scheme of the object store that holds `path` (`s3`), if one does.
pub fn object_scheme(path: &Path) -> Option<&'static str> {
    object_store(path).map(|i| OBJECT_STORES[i].0.name)
}

/// The store that holds `path`, named for local paths ([`s3::Scheme::place`]), if one does.
pub(crate) fn object_place(path: &Path) -> Option<String> {
    object_store(path).map(|i| OBJECT_STORES[i].0.place())
}

/// A backend and its [`Paced`] twin.
pub(crate) type Pair = (&'static dyn Source, &'static dyn Source);

/// Sources registered at run time for a scheme by a module above the seam, which presents
/// other storage as shards and so cannot be a match arm here (`tree://`, see `crate::tree`).
static REGISTERED: std::sync::RwLock<Vec<(&'static str, Pair)>> =
    std::sync::RwLock::new(Vec::new());

/// Registers `backend` (and its [`Paced`] twin) as the source of `scheme://…`; once is enough.
pub(crate) fn register_source(scheme: &'static str, backend: Pair) {
    let mut registered = REGISTERED.write().unwrap_or_else(|e| e.into_inner());
    if registered.iter().all(|(s, _)| *s != scheme) {
        registered.push((scheme, backend));
    }
}

/// The source registered for `scheme`, if any.
pub(super) fn registered(scheme: Option<&str>) -> Option<Pair> {
    let registered = REGISTERED.read().unwrap_or_else(|e| e.into_inner());
    registered
        .iter()
        .find(|(s, _)| Some(*s) == scheme)
        .map(|(_, pair)| *pair)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_scheme_is_an_object_store_and_nothing_else_is() {
        for (path, want) in [
            ("s3://b/k", Some("s3")),
            ("gs://b/k", Some("gs")),
            ("az://c/k", Some("az")),
            ("mem://x/k", None),
            ("/data/s3://b", None),
            ("s3:/b/k", None),
        ] {
            assert_eq!(object_scheme(Path::new(path)), want, "{path}");
            assert_eq!(is_object_store(Path::new(path)), want.is_some(), "{path}");
        }
        let names: Vec<_> = OBJECT_STORES.iter().map(|o| o.0.name).collect();
        let paced: Vec<_> = PACED_OBJECT_STORES.iter().map(|p| p.0 .0.name).collect();
        assert_eq!(names, paced, "the paced twins in the same order");
    }
}
