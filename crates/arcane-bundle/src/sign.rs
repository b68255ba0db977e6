//! Who built a bundle: Ed25519 signatures over its manifest, in minisign's formats.
//!
//! Verification proves a bundle is intact; a signature proves who built it. Flipping a
//! model byte and rewriting both digests in the manifest yields a bundle that verifies,
//! but not one signed by a trusted key, because the manifest — which lists every file
//! with its SHA-256 — is what is signed.
//!
//! # Files
//!
//! * The **public key** (`KEY.pub`) and the **signature** (`<bundle>/arcane-bundle.json.minisig`)
//!   are minisign's: a public key is `untrusted comment: …` then base64 of
//!   `"Ed" ‖ key id (8 bytes) ‖ public key (32)`; a signature is `untrusted comment: …`,
//!   base64 of `"Ed" ‖ key id ‖ Ed25519(manifest)`, `trusted comment: …`, and base64 of
//!   Ed25519(signature ‖ trusted comment). `minisign -Vm arcane-bundle.json -p KEY.pub`
//!   checks a bundle too.
//! * The **secret key** (`KEY`, mode 0600) is Arcane's own, unencrypted file:
//!   `untrusted comment: …` then base64 of `"ArcaneSK" ‖ "Ed" ‖ key id ‖ seed (32)` (the
//!   marker keeps it from being taken for a public key). Keep it private.
//!
//! A key id is 8 random bytes, shown as 16 upper-case hex digits (as minisign does, in
//! little-endian order), and named in every refusal so the person knows which key was
//! expected and which one signed.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use ed25519_dalek::{Signer, SigningKey, Verifier, VerifyingKey};

/// The signature's file name at the bundle root, next to the manifest.
pub const SIGNATURE_NAME: &str = "arcane-bundle.json.minisig";
/// What a secret key's payload starts with.
const SECRET_MARKER: &[u8] = b"ArcaneSKEd";
/// The largest signature file read.
const MAX_SIGNATURE_BYTES: usize = 4096;

/// Why a key or signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignError {
    /// A key file is not one of ours (or minisign's public key format).
    #[error("`{}` is not an Arcane bundle {what} key: {why}", path.display())]
    BadKey {
        /// The file.
        path: PathBuf,
        /// `public` or `secret`.
        what: &'static str,
        /// What is wrong.
        why: String,
    },
    /// The signature file is missing.
    #[error("the bundle is not signed (no `{SIGNATURE_NAME}`), but key {trusted} is trusted")]
    Unsigned {
        /// The trusted key's id.
        trusted: String,
    },
    /// The signature file is malformed.
    #[error("the bundle's signature is malformed: {why}")]
    Malformed {
        /// What is wrong.
        why: String,
    },
    /// The bundle was signed by another key.
    #[error("the bundle is signed by key {signed_by}, not by the trusted key {trusted}")]
    WrongKey {
        /// The key id in the signature.
        signed_by: String,
        /// The trusted key's id.
        trusted: String,
    },
    /// The signature does not match the manifest (or its trusted comment was changed).
    #[error("the bundle's signature by key {trusted} does not match its manifest")]
    Invalid {
        /// The trusted key's id.
        trusted: String,
    },
    /// Randomness or file I/O failed.
    #[error("{0}")]
    Io(String),
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// `[8 bytes]` as 16 upper-case hex digits, last byte first (minisign's display).
fn key_id_text(id: &[u8; 8]) -> String {
    id.iter().rev().map(|b| format!("{b:02X}")).collect()
}

/// A public key: its id and the Ed25519 verifying key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    id: [u8; 8],
    key: VerifyingKey,
}

/// A secret key: its id and the Ed25519 signing key.
pub struct SecretKey {
    id: [u8; 8],
    key: SigningKey,
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretKey({})", key_id_text(&self.id))
    }
}

/// Makes a new key pair from the operating system's randomness.
pub fn generate() -> Result<SecretKey, SignError> {
    let seed: [u8; 32] = arcane_files::secret_bytes().map_err(|e| SignError::Io(e.to_string()))?;
    let id: [u8; 8] = arcane_files::secret_bytes().map_err(|e| SignError::Io(e.to_string()))?;
    Ok(SecretKey {
        id,
        key: SigningKey::from_bytes(&seed),
    })
}

fn bad_key(path: &Path, what: &'static str, why: &str) -> SignError {
    SignError::BadKey {
        path: path.to_path_buf(),
        what,
        why: why.to_string(),
    }
}

/// The decoded payload of the key file at `path` (`what`: `public` or `secret`).
fn read_key_file(path: &Path, what: &'static str) -> Result<Vec<u8>, SignError> {
    let text = arcane_files::read_regular_text(path, 4096)
        .map_err(|e| bad_key(path, what, &e.to_string()))?;
    payload(&text).ok_or_else(|| bad_key(path, what, "no base64 key line after the comment"))
}

/// The payload line of a key or signature file: the line after the untrusted comment.
fn payload(text: &str) -> Option<Vec<u8>> {
    let mut lines = text.lines();
    lines.next()?.strip_prefix("untrusted comment:")?;
    b64().decode(lines.next()?.trim()).ok()
}

impl PublicKey {
    /// The key id, as shown in messages.
    pub fn id(&self) -> String {
        key_id_text(&self.id)
    }

    /// The public key file's text (minisign's format).
    pub fn to_text(&self) -> String {
        let mut bytes = b"Ed".to_vec();
        bytes.extend_from_slice(&self.id);
        bytes.extend_from_slice(self.key.as_bytes());
        format!(
            "untrusted comment: arcane bundle public key {}\n{}\n",
            self.id(),
            b64().encode(bytes)
        )
    }

    /// Reads a public key file.
    pub fn read(path: &Path) -> Result<PublicKey, SignError> {
        let bad = |why: &str| bad_key(path, "public", why);
        let bytes = read_key_file(path, "public")?;
        if bytes.len() != 42 || &bytes[..2] != b"Ed" {
            return Err(bad(
                "not an Ed25519 public key (42 bytes starting with `Ed`)",
            ));
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&bytes[2..10]);
        let mut key = [0u8; 32];
        key.copy_from_slice(&bytes[10..]);
        let key = VerifyingKey::from_bytes(&key).map_err(|_| bad("not a valid Ed25519 point"))?;
        Ok(PublicKey { id, key })
    }
}

impl SecretKey {
    /// The matching public key.
    pub fn public(&self) -> PublicKey {
        PublicKey {
            id: self.id,
            key: self.key.verifying_key(),
        }
    }

    /// The secret key file's text.
    pub fn to_text(&self) -> String {
        let mut bytes = SECRET_MARKER.to_vec();
        bytes.extend_from_slice(&self.id);
        bytes.extend_from_slice(&self.key.to_bytes());
        format!(
            "untrusted comment: arcane bundle secret key {} (keep it private)\n{}\n",
            key_id_text(&self.id),
            b64().encode(bytes)
        )
    }

    /// Reads a secret key file.
    pub fn read(path: &Path) -> Result<SecretKey, SignError> {
        let bad = |why: &str| bad_key(path, "secret", why);
        let bytes = read_key_file(path, "secret")?;
        let Some(rest) = bytes.strip_prefix(SECRET_MARKER).filter(|r| r.len() == 40) else {
            return Err(bad("not an Arcane Ed25519 secret key"));
        };
        let mut id = [0u8; 8];
        id.copy_from_slice(&rest[..8]);
        let mut seed = [0u8; 32];
        seed.copy_from_slice(&rest[8..]);
        Ok(SecretKey {
            id,
            key: SigningKey::from_bytes(&seed),
        })
    }

    /// Signs `manifest` (the exact bytes of `arcane-bundle.json`), with `comment` as the
    /// signed trusted comment; returns the signature file's text.
    pub fn sign(&self, manifest: &[u8], comment: &str) -> String {
        let signature = self.key.sign(manifest).to_bytes();
        let mut global = signature.to_vec();
        global.extend_from_slice(comment.as_bytes());
        let global = self.key.sign(&global).to_bytes();
        let mut line = b"Ed".to_vec();
        line.extend_from_slice(&self.id);
        line.extend_from_slice(&signature);
        format!(
            "untrusted comment: signature from arcane bundle secret key {}\n{}\ntrusted comment: {comment}\n{}\n",
            key_id_text(&self.id),
            b64().encode(line),
            b64().encode(global)
        )
    }
}

/// Checks `signature` (the signature file's text, `None` when there is none) over
/// `manifest` against `trusted`.
pub fn check(
    manifest: &[u8],
    signature: Option<&[u8]>,
    trusted: &PublicKey,
) -> Result<(), SignError> {
    let Some(signature) = signature else {
        return Err(SignError::Unsigned {
            trusted: trusted.id(),
        });
    };
    let malformed = |why: &str| SignError::Malformed {
        why: why.to_string(),
    };
    if signature.len() > MAX_SIGNATURE_BYTES {
        return Err(malformed("larger than 4 KiB"));
    }
    let text = std::str::from_utf8(signature).map_err(|_| malformed("not UTF-8"))?;
    let lines: Vec<&str> = text.lines().collect();
    let [untrusted, line, trusted_line, global] = lines[..] else {
        return Err(malformed("not four lines"));
    };
    if !untrusted.starts_with("untrusted comment:") {
        return Err(malformed("no untrusted comment"));
    }
    let comment = trusted_line
        .strip_prefix("trusted comment: ")
        .ok_or_else(|| malformed("no trusted comment"))?;
    let line = b64()
        .decode(line.trim())
        .map_err(|_| malformed("bad base64"))?;
    if line.len() != 74 || &line[..2] != b"Ed" {
        return Err(malformed(
            "not an Ed25519 signature over the manifest itself",
        ));
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&line[2..10]);
    if id != trusted.id {
        return Err(SignError::WrongKey {
            signed_by: key_id_text(&id),
            trusted: trusted.id(),
        });
    }
    let invalid = || SignError::Invalid {
        trusted: trusted.id(),
    };
    let signature = ed25519_dalek::Signature::from_slice(&line[10..]).map_err(|_| invalid())?;
    trusted
        .key
        .verify(manifest, &signature)
        .map_err(|_| invalid())?;
    let global = b64()
        .decode(global.trim())
        .map_err(|_| malformed("bad base64"))?;
    let global = ed25519_dalek::Signature::from_slice(&global).map_err(|_| invalid())?;
    let mut signed = line[10..].to_vec();
    signed.extend_from_slice(comment.as_bytes());
    trusted.key.verify(&signed, &global).map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_checks_only_with_its_key_over_its_exact_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let secret = generate().unwrap();
        let public = secret.public();
        std::fs::write(dir.path().join("k"), secret.to_text()).unwrap();
        std::fs::write(dir.path().join("k.pub"), public.to_text()).unwrap();
        let secret = SecretKey::read(&dir.path().join("k")).unwrap();
        let public = PublicKey::read(&dir.path().join("k.pub")).unwrap();
        assert_eq!(public, secret.public());
        let manifest = br#"{"files":[]}"#;
        let signature = secret.sign(manifest, "bundle demo");
        assert_eq!(check(manifest, Some(signature.as_bytes()), &public), Ok(()));
        // Tampered manifest, tampered trusted comment, another key, no signature.
        assert!(matches!(
            check(br#"{"files":[1]}"#, Some(signature.as_bytes()), &public),
            Err(SignError::Invalid { .. })
        ));
        let edited = signature.replace("bundle demo", "bundle evil");
        assert!(matches!(
            check(manifest, Some(edited.as_bytes()), &public),
            Err(SignError::Invalid { .. })
        ));
        let other = generate().unwrap().public();
        let error = check(manifest, Some(signature.as_bytes()), &other).unwrap_err();
        assert!(matches!(error, SignError::WrongKey { .. }));
        assert!(error.to_string().contains(&public.id()), "{error}");
        assert!(error.to_string().contains(&other.id()), "{error}");
        assert!(matches!(
            check(manifest, None, &public),
            Err(SignError::Unsigned { .. })
        ));
        // A secret key given where a public key belongs is refused, not misread.
        assert!(PublicKey::read(&dir.path().join("k")).is_err());
        assert!(SecretKey::read(&dir.path().join("k.pub")).is_err());
    }
}
