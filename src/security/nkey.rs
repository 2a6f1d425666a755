//! The NATS NKey user seed (`SU...`), read from its file and checked at start.

use super::SecurityError;
use std::path::Path;

/// The seed in `path`, checked to be an NKey user seed. Never logged; errors
/// name the file only.
pub fn read_seed(path: &Path) -> Result<String, SecurityError> {
    let fail = |reason: &'static str| SecurityError::NkeySeed {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|source| SecurityError::NkeyUnreadable {
        path: path.display().to_string(),
        source,
    })?;
    let seed = text.trim();
    let pair = nkeys::KeyPair::from_seed(seed)
        .map_err(|_| fail("does not hold an NKey seed; expected one line starting with SU (nsc or `nk -gen user` make one)"))?;
    if pair.key_pair_type() != nkeys::KeyPairType::User {
        return Err(fail(
            "holds an NKey seed that is not a user seed; expected one starting with SU",
        ));
    }
    Ok(seed.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn only_user_seeds_are_accepted_and_never_shown() {
        let user = nkeys::KeyPair::new_user();
        let account = nkeys::KeyPair::new_account();
        let cases = [
            (user.seed().unwrap(), true),
            (format!("  {}\n", user.seed().unwrap()), true),
            (account.seed().unwrap(), false),
            ("SUNOTASEED".to_string(), false),
            (String::new(), false),
        ];
        for (text, ok) in cases {
            let mut f = tempfile::NamedTempFile::new().unwrap();
            f.write_all(text.as_bytes()).unwrap();
            match read_seed(f.path()) {
                Ok(seed) => assert!(ok && seed == text.trim(), "{text:?} accepted"),
                Err(e) => {
                    assert!(!ok, "{text:?} refused: {e}");
                    let shown = e.to_string();
                    assert!(shown.starts_with("nats.nkey_seed_file: "), "{shown}");
                    if !text.trim().is_empty() {
                        assert!(!shown.contains(text.trim()), "{shown} shows the seed");
                    }
                }
            }
        }
    }
}
