//! Named profiles of the AWS shared files, as every AWS tool reads them (the `object_store`
//! crate reads only the `AWS_*` variables): the profile `AWS_PROFILE` (else
//! `AWS_DEFAULT_PROFILE`, else `default`) of the credentials file (`AWS_SHARED_CREDENTIALS_FILE`,
//! else `~/.aws/credentials`, sections `[NAME]`) and of the config file (`AWS_CONFIG_FILE`, else
//! `~/.aws/config`, sections `[profile NAME]` or `[default]`), the credentials file first. The
//! variables win over both, key by key, as with the AWS CLI.
//!
//! Only static keys are read from a profile (`aws_access_key_id`, `aws_secret_access_key`,
//! `aws_session_token`), with `region` and `endpoint_url`. A profile that gets its keys
//! otherwise (an assumed role, SSO, a credential process) is refused with what to do instead:
//! reshard runs no other program and keeps no SSO cache.

use std::io;
use std::path::{Path, PathBuf};

/// What a profile gives.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Profile {
    pub(crate) name: String,
    pub(crate) access_key_id: Option<String>,
    pub(crate) secret_access_key: Option<String>,
    pub(crate) session_token: Option<String>,
    pub(crate) region: Option<String>,
    pub(crate) endpoint_url: Option<String>,
    /// A key that names another way to get credentials (`role_arn`, `sso_session`, …).
    pub(crate) other_source: Option<String>,
}

/// Keys that get credentials in a way reshard does not follow.
const OTHER_SOURCES: [&str; 6] = [
    "role_arn",
    "source_profile",
    "credential_process",
    "sso_session",
    "sso_start_url",
    "web_identity_token_file",
];

/// The profile the environment selects, from the shared files; `None` when no profile was
/// named and the files hold no `default` (the variables and the instance's role then decide).
///
/// # Errors
/// A profile named by `AWS_PROFILE` is in neither file, or a file cannot be read.
pub(crate) fn selected() -> io::Result<Option<Profile>> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let named = var("AWS_PROFILE").or_else(|| var("AWS_DEFAULT_PROFILE"));
    let name = named.clone().unwrap_or_else(|| "default".to_string());
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let file = |var_name: &str, rel: &str| {
        std::env::var_os(var_name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws").join(rel)))
    };
    let files = [
        (file("AWS_SHARED_CREDENTIALS_FILE", "credentials"), false),
        (file("AWS_CONFIG_FILE", "config"), true),
    ];
    let mut found: Option<Profile> = None;
    for (path, is_config) in &files {
        let Some(text) = path.as_deref().map(read).transpose()?.flatten() else {
            continue;
        };
        if let Some(p) = parse(&text, &name, *is_config) {
            found = Some(match found {
                Some(first) => first.or(p),
                None => p,
            });
        }
    }
    if found.is_none() && named.is_some() {
        let names: Vec<String> = files
            .iter()
            .filter_map(|(p, _)| p.as_ref().map(|p| p.display().to_string()))
            .collect();
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "AWS_PROFILE {name}: no such profile in {} (sections [{name}] in the credentials file, [profile {name}] in the config file)",
                names.join(" or ")
            ),
        ));
    }
    Ok(found)
}

/// The text of `path`, or `None` if it does not exist.
fn read(path: &Path) -> io::Result<Option<String>> {
    match super::source(path).read(path) {
        Ok(b) => Ok(Some(String::from_utf8_lossy(&b).into_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("{}: cannot read the AWS shared file ({e})", path.display()),
        )),
    }
}

impl Profile {
    /// This profile, each missing key taken from `other`.
    fn or(self, other: Profile) -> Profile {
        Profile {
            name: self.name,
            access_key_id: self.access_key_id.or(other.access_key_id),
            secret_access_key: self.secret_access_key.or(other.secret_access_key),
            session_token: self.session_token.or(other.session_token),
            region: self.region.or(other.region),
            endpoint_url: self.endpoint_url.or(other.endpoint_url),
            other_source: self.other_source.or(other.other_source),
        }
    }
}

/// The profile `name` of one shared file (INI: `[section]`, `key = value`, `#` and `;`
/// comments); in a config file its section is `[profile NAME]`, or `[default]`.
pub(crate) fn parse(text: &str, name: &str, is_config: bool) -> Option<Profile> {
    let wanted = |section: &str| {
        let section = section.trim();
        if is_config && name != "default" {
            section
                .strip_prefix("profile")
                .filter(|rest| rest.starts_with(char::is_whitespace))
                .is_some_and(|rest| rest.trim() == name)
        } else {
            section == name || (is_config && section == "profile default")
        }
    };
    let mut inside = false;
    let mut profile: Option<Profile> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = wanted(section);
            if inside && profile.is_none() {
                profile = Some(Profile {
                    name: name.to_string(),
                    ..Profile::default()
                });
            }
            continue;
        }
        let (Some(p), Some((key, value))) =
            (profile.as_mut().filter(|_| inside), line.split_once('='))
        else {
            continue;
        };
        let (key, value) = (key.trim().to_ascii_lowercase(), value.trim().to_string());
        match key.as_str() {
            "aws_access_key_id" => p.access_key_id = Some(value),
            "aws_secret_access_key" => p.secret_access_key = Some(value),
            "aws_session_token" => p.session_token = Some(value),
            "region" => p.region = Some(value),
            "endpoint_url" => p.endpoint_url = Some(value),
            k if OTHER_SOURCES.contains(&k) => p.other_source = Some(key),
            _ => {}
        }
    }
    profile
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREDENTIALS: &str = "\
# a comment
[default]
aws_access_key_id = AKIDDEFAULT
aws_secret_access_key = s3cr3t

[lab]
aws_access_key_id=AKIDLAB
aws_secret_access_key = labsecret
aws_session_token = tok
";

    const CONFIG: &str = "\
[default]
region = eu-west-1
[profile lab]
region = us-west-2
endpoint_url = http://127.0.0.1:8333
[profile sso]
sso_session = corp
[sso-session corp]
region = eu-central-1
";

    #[test]
    fn reads_the_named_profile_of_each_file() {
        let lab = parse(CREDENTIALS, "lab", false).unwrap();
        assert_eq!(lab.access_key_id.as_deref(), Some("AKIDLAB"));
        assert_eq!(lab.secret_access_key.as_deref(), Some("labsecret"));
        assert_eq!(lab.session_token.as_deref(), Some("tok"));
        let config = parse(CONFIG, "lab", true).unwrap();
        assert_eq!(config.region.as_deref(), Some("us-west-2"));
        assert_eq!(
            config.endpoint_url.as_deref(),
            Some("http://127.0.0.1:8333")
        );
        let both = lab.or(config);
        assert_eq!(both.access_key_id.as_deref(), Some("AKIDLAB"));
        assert_eq!(both.region.as_deref(), Some("us-west-2"));
        // `[default]` in both files; a config file's `[lab]` is not the profile lab.
        assert_eq!(
            parse(CONFIG, "default", true).unwrap().region.as_deref(),
            Some("eu-west-1")
        );
        assert!(parse("[lab]\nregion = x\n", "lab", true).is_none());
        assert!(parse(CREDENTIALS, "nobody", false).is_none());
        assert!(parse(CONFIG, "corp", true).is_none());
        let sso = parse(CONFIG, "sso", true).unwrap();
        assert_eq!(sso.other_source.as_deref(), Some("sso_session"));
        assert!(sso.access_key_id.is_none() && sso.region.is_none());
    }
}
