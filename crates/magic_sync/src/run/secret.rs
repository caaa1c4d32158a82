//! Secrets kept in files rather than on the command line, where `ps`
//! would show them: a replica's secret or seed, the server's seed on a
//! broker.

use std::path::Path;

/// The first line of the file at `path`, without its end: a secret or a
/// seed kept out of the command line (where `ps` would show it). Errors
/// name the file, never its content.
pub fn read_secret(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the secret file {}: {e}", path.display()))?;
    let secret = text.lines().next().unwrap_or("").trim().to_string();
    if secret.is_empty() {
        return Err(format!("the secret file {} is empty", path.display()));
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::read_secret;

    #[test]
    fn a_secret_is_the_first_line_and_errors_name_the_file_not_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "  s3cret \nsomething else\n").unwrap();
        assert_eq!(read_secret(&path).unwrap(), "s3cret");
        std::fs::write(&path, "\nSECOND-LINE").unwrap();
        let err = read_secret(&path).unwrap_err();
        assert!(
            err.contains("is empty") && err.contains(&path.display().to_string()),
            "{err}"
        );
        assert!(!err.contains("SECOND-LINE"), "{err}");
        let missing = dir.path().join("missing");
        assert!(read_secret(&missing).unwrap_err().contains("cannot read"));
    }
}
