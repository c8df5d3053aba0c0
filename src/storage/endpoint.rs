//! What an S3 endpoint (`AWS_ENDPOINT_URL`, `AWS_ENDPOINT_URL_S3`, a profile's `endpoint_url`)
//! must look like, checked before the S3 client is made: the client panics on some malformed
//! values (`127.0.0.1:8333` without a scheme, a space, port 99999, an empty host), which would
//! end a run with exit 70 instead of a message naming the variable.

/// The variables that name an S3 endpoint, in the order the client prefers them.
pub const VARIABLES: [&str; 2] = ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"];

/// What a valid value looks like, for messages.
pub const EXAMPLE: &str = "http://127.0.0.1:8333 or https://s3.example.com";

/// Checks the endpoint variables that are set (and not empty: the client takes an empty one
/// as unset).
///
/// # Errors
/// The first malformed one, named, with what is wrong and what a valid value looks like.
pub fn check_environment() -> Result<(), String> {
    for name in VARIABLES {
        let Some(value) = std::env::var_os(name).filter(|v| !v.is_empty()) else {
            continue;
        };
        let value = value.to_string_lossy();
        check(&value).map_err(|why| described(name, &value, &why))?;
    }
    Ok(())
}

/// The message for the malformed endpoint `value` of `name` (the value is not repeated when it
/// may hold a password).
pub fn described(name: &str, value: &str, why: &str) -> String {
    let shown = if value.contains('@') {
        String::new()
    } else {
        format!("={value:?}")
    };
    format!("{name}{shown} is not a valid S3 endpoint: {why}; expected a URL such as {EXAMPLE}")
}

/// Checks an endpoint URL: `http` or `https`, `://`, a host (a name, an IPv4 address or a
/// bracketed IPv6 one), an optional port from 1 to 65535, an optional path; no spaces, control
/// characters, user name, query or fragment.
///
/// # Errors
/// What is wrong with it, in words.
pub fn check(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("it is empty".into());
    }
    if let Some(c) = value.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("it holds {c:?}, which a URL cannot"));
    }
    let Some((scheme, rest)) = value.split_once("://") else {
        return Err("it has no scheme (http:// or https://)".into());
    };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return Err(format!("its scheme {scheme:?} is neither http nor https"));
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if let Some(c) = rest.chars().find(|c| matches!(c, '?' | '#')) {
        return Err(format!(
            "it holds {c:?}: an endpoint has no query or fragment"
        ));
    }
    if authority.contains('@') {
        return Err(
            "it names a user: keys go in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY".into(),
        );
    }
    let (host, port) = host_and_port(authority)?;
    if host.is_empty() {
        return Err("its host is empty".into());
    }
    if let Some(port) = port {
        match port.parse::<u32>() {
            Ok(p) if (1..=65535).contains(&p) && port.bytes().all(|b| b.is_ascii_digit()) => {}
            _ => return Err(format!("its port {port:?} is not a number from 1 to 65535")),
        }
    }
    Ok(())
}

/// The host and port of `authority` (`host`, `host:port`, `[v6]`, `[v6]:port`).
fn host_and_port(authority: &str) -> Result<(&str, Option<&str>), String> {
    if let Some(v6) = authority.strip_prefix('[') {
        let Some((host, after)) = v6.split_once(']') else {
            return Err("its IPv6 host has no closing ']'".into());
        };
        if !host
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
            || host.is_empty()
        {
            return Err(format!("its host [{host}] is not an IPv6 address"));
        }
        return match after {
            "" => Ok((host, None)),
            _ => match after.strip_prefix(':') {
                Some(port) => Ok((host, Some(port))),
                None => Err(format!("{after:?} follows its IPv6 host")),
            },
        };
    }
    let (host, port) = match authority.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (authority, None),
    };
    if let Some(c) = host
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')))
    {
        return Err(format!("its host {host:?} holds {c:?}"));
    }
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_checked() {
        for good in [
            "http://127.0.0.1:8333",
            "https://s3.us-east-1.amazonaws.com",
            "HTTP://minio:9000/",
            "http://[::1]:8333",
            "https://storage.example.com/s3",
        ] {
            assert_eq!(check(good), Ok(()), "{good}");
        }
        for (bad, why) in [
            ("127.0.0.1:8333", "no scheme"),
            ("http://127.0.0.1 :8333", "' '"),
            ("http://127.0.0.1:99999", "port \"99999\""),
            ("http://127.0.0.1:0", "port"),
            ("http://127.0.0.1:", "port \"\""),
            ("http://127.0.0.1:+80", "port"),
            ("http://", "host is empty"),
            ("http://:8333", "host is empty"),
            ("", "empty"),
            ("ftp://host", "neither http nor https"),
            ("http://user:pw@host", "names a user"),
            ("http://host/?x=1", "query"),
            ("http://[::1:8333", "closing"),
            ("http://ho%st", "'%'"),
        ] {
            let e = check(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
