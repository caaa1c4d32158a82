//! Rendering a `tokio_postgres::Config` for libpq programs.

use std::fmt::Write as _;

use tokio_postgres::config::Host;
use tokio_postgres::Config;

/// Host, port, user, dbname and password (when set) as a libpq `key=value` string.
pub(crate) fn conninfo(config: &Config) -> String {
    render(config, true)
}

/// Like [`conninfo`] but never showing the password, for messages.
pub(crate) fn conninfo_without_password(config: &Config) -> String {
    render(config, false)
}

fn render(config: &Config, with_password: bool) -> String {
    let mut pairs: Vec<(&str, String)> = Vec::new();
    if let Some(host) = first_host(config) {
        pairs.push(("host", host));
    }
    if let Some(port) = config.get_ports().first() {
        pairs.push(("port", port.to_string()));
    }
    if let Some(user) = config.get_user() {
        pairs.push(("user", user.to_owned()));
    }
    if let Some(dbname) = config.get_dbname() {
        pairs.push(("dbname", dbname.to_owned()));
    }
    if with_password {
        if let Some(password) = config.get_password() {
            pairs.push(("password", String::from_utf8_lossy(password).into_owned()));
        }
    }
    let mut out = String::new();
    for (key, value) in pairs {
        if !out.is_empty() {
            out.push(' ');
        }
        let _ = write!(out, "{key}={}", quote_value(&value));
    }
    out
}

fn first_host(config: &Config) -> Option<String> {
    match config.get_hosts().first()? {
        Host::Tcp(name) => Some(name.clone()),
        Host::Unix(path) => Some(path.to_string_lossy().into_owned()),
    }
}

/// Quotes a conninfo value when needed: single quotes, with `\` and `'` escaped.
fn quote_value(value: &str) -> String {
    let plain = !value.is_empty()
        && !value
            .chars()
            .any(|c| c.is_whitespace() || c == '\'' || c == '\\');
    if plain {
        return value.to_owned();
    }
    let mut quoted = String::with_capacity(value.len() + 2);
    quoted.push('\'');
    for c in value.chars() {
        if c == '\'' || c == '\\' {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('\'');
    quoted
}

/// The same settings as a `postgresql://` URL.
pub(crate) fn url(config: &Config) -> String {
    let mut out = String::from("postgresql://");
    if let Some(user) = config.get_user() {
        out.push_str(&percent_encode(user.as_bytes()));
        if let Some(password) = config.get_password() {
            out.push(':');
            out.push_str(&percent_encode(password));
        }
        out.push('@');
    }
    let mut query = String::new();
    match config.get_hosts().first() {
        Some(Host::Tcp(name)) if name.contains(':') => {
            let _ = write!(out, "[{name}]");
        }
        Some(Host::Tcp(name)) => out.push_str(&percent_encode(name.as_bytes())),
        Some(Host::Unix(path)) => {
            query = format!(
                "?host={}",
                percent_encode(path.to_string_lossy().as_bytes())
            );
        }
        None => {}
    }
    if let Some(port) = config.get_ports().first() {
        let _ = write!(out, ":{port}");
    }
    out.push('/');
    if let Some(dbname) = config.get_dbname() {
        out.push_str(&percent_encode(dbname.as_bytes()));
    }
    out.push_str(&query);
    out
}

fn percent_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_key_value_pairs() {
        let config: Config = "host=127.0.0.1 port=5433 user=postgres dbname=t_1 password='a b'"
            .parse()
            .unwrap();
        assert_eq!(
            conninfo(&config),
            "host=127.0.0.1 port=5433 user=postgres dbname=t_1 password='a b'"
        );
        assert_eq!(
            conninfo_without_password(&config),
            "host=127.0.0.1 port=5433 user=postgres dbname=t_1"
        );
    }

    #[test]
    fn quotes_awkward_values() {
        assert_eq!(quote_value("plain"), "plain");
        assert_eq!(quote_value(""), "''");
        assert_eq!(quote_value("it's"), r"'it\'s'");
        assert_eq!(quote_value(r"a\b"), r"'a\\b'");
    }

    #[test]
    fn round_trips_through_url() {
        let config: Config = "host=localhost port=5432 user=me password=p@ss dbname=db"
            .parse()
            .unwrap();
        let rendered = url(&config);
        assert_eq!(rendered, "postgresql://me:p%40ss@localhost:5432/db");
        let parsed: Config = rendered.parse().unwrap();
        assert_eq!(parsed.get_password(), Some(&b"p@ss"[..]));
        assert_eq!(parsed.get_dbname(), Some("db"));
    }
}
