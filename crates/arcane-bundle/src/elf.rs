//! The `DT_NEEDED` names of an ELF file: which shared libraries an executable (or a
//! library) asks the dynamic loader for, by the exact names it will look up.
//!
//! A bundle copies a runtime's libraries under these names, so a library installed as
//! `libllama.so.0 -> libllama.so.0.6.0` arrives as a regular file `libllama.so.0`,
//! which is what `llama-server` asks for. Only 64-bit little-endian ELF is read;
//! anything else returns `None` and the builder falls back to copying every library.

fn u16_at(bytes: &[u8], offset: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        bytes.get(offset..offset + 2)?.try_into().ok()?,
    ))
}

fn u32_at(bytes: &[u8], offset: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        bytes.get(offset..offset + 4)?.try_into().ok()?,
    ))
}

fn u64_at(bytes: &[u8], offset: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        bytes.get(offset..offset + 8)?.try_into().ok()?,
    ))
}

/// The `DT_NEEDED` entries of a 64-bit little-endian ELF image, in order; `None` when
/// `bytes` is not such an image or its dynamic section is malformed. An ELF without a
/// dynamic section (static) yields an empty list.
pub(crate) fn needed_libraries(bytes: &[u8]) -> Option<Vec<String>> {
    const SHT_DYNAMIC: u32 = 6;
    const DT_NULL: u64 = 0;
    const DT_NEEDED: u64 = 1;
    if bytes.get(0..4)? != b"\x7fELF" || *bytes.get(4)? != 2 || *bytes.get(5)? != 1 {
        return None;
    }
    let section_offset = usize::try_from(u64_at(bytes, 0x28)?).ok()?;
    let section_size = usize::from(u16_at(bytes, 0x3a)?);
    let section_count = usize::from(u16_at(bytes, 0x3c)?);
    if section_size < 64 {
        return None;
    }
    let section = |index: usize| -> Option<(u32, usize, usize, usize)> {
        let base = section_offset.checked_add(index.checked_mul(section_size)?)?;
        let kind = u32_at(bytes, base + 4)?;
        let offset = usize::try_from(u64_at(bytes, base + 24)?).ok()?;
        let size = usize::try_from(u64_at(bytes, base + 32)?).ok()?;
        let link = usize::try_from(u32_at(bytes, base + 40)?).ok()?;
        Some((kind, offset, size, link))
    };
    let mut names = Vec::new();
    for index in 0..section_count {
        let (kind, offset, size, link) = section(index)?;
        if kind != SHT_DYNAMIC {
            continue;
        }
        let (_, strings, strings_size, _) = section(link)?;
        let table = bytes.get(strings..strings.checked_add(strings_size)?)?;
        let entries = bytes.get(offset..offset.checked_add(size)?)?;
        for entry in entries.chunks_exact(16) {
            let tag = u64_at(entry, 0)?;
            if tag == DT_NULL {
                break;
            }
            if tag == DT_NEEDED {
                let start = usize::try_from(u64_at(entry, 8)?).ok()?;
                let rest = table.get(start..)?;
                let end = rest.iter().position(|b| *b == 0)?;
                names.push(String::from_utf8(rest[..end].to_vec()).ok()?);
            }
        }
    }
    Some(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_needed_libraries_of_this_test_binary() {
        let bytes = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let needed = needed_libraries(&bytes).expect("the test binary is a 64-bit ELF");
        assert!(
            needed.iter().any(|n| n.starts_with("libc.so")),
            "{needed:?}"
        );
    }

    #[test]
    fn refuses_what_is_not_elf() {
        assert_eq!(needed_libraries(b"#!/bin/sh\necho hi\n"), None);
        assert_eq!(needed_libraries(b""), None);
        let mut truncated = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        truncated.truncate(100);
        assert_eq!(needed_libraries(&truncated), None);
    }
}
