//! Parsing per-GPU limits from text, for `tessera-agent region` and
//! tests: `GPU-<uuid>[,memory=<MiB>][,overhead=<MiB>][,rate=<warps/s>][,burst=<warps>][,floor=<warps>]`.
//! `rate=unlimited` and `memory=unlimited` are accepted; omitted fields
//! are unlimited (burst defaults to 1/100 of the rate, at least 1).

use crate::control::GpuLimits;
use crate::layout::UNLIMITED;

/// Why a GPU spec was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// The UUID part is malformed.
    #[error(
        "gpu spec {spec:?}: {uuid:?} is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"
    )]
    Uuid {
        /// The whole spec.
        spec: String,
        /// The offending part.
        uuid: String,
    },
    /// A `key=value` part is malformed.
    #[error("gpu spec {spec:?}: {part:?} {problem}")]
    Field {
        /// The whole spec.
        spec: String,
        /// The offending part.
        part: String,
        /// What is wrong.
        problem: String,
    },
}

/// Parses a `GPU-…` UUID (the prefix and the hex digits in any case, as
/// UUIDs compare case-insensitively). This is the one text codec of GPU
/// UUIDs; `tessera-api`'s `GpuUuid` wraps it.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let b = s.as_bytes();
    if b.len() != UUID_TEXT_LEN || !b[..4].eq_ignore_ascii_case(b"GPU-") {
        return None;
    }
    let mut out = [0u8; 16];
    let mut at = 4;
    for (n, group) in UUID_GROUPS.iter().enumerate() {
        if n > 0 {
            if b[at] != b'-' {
                return None;
            }
            at += 1;
        }
        for _ in 0..*group {
            let byte = (hex_value(b[at])? << 4) | hex_value(b[at + 1])?;
            out[(at - 4 - n) / 2] = byte;
            at += 2;
        }
    }
    Some(out)
}

/// Length of `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
const UUID_TEXT_LEN: usize = 40;
/// Bytes per dash-separated group.
const UUID_GROUPS: [usize; 5] = [4, 2, 2, 2, 6];

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Formats a UUID as `GPU-…` (lower-case hex, one allocation).
pub fn format_uuid(b: &[u8; 16]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(UUID_TEXT_LEN);
    out.push_str("GPU-");
    let mut i = 0;
    for (n, group) in UUID_GROUPS.iter().enumerate() {
        if n > 0 {
            out.push('-');
        }
        for _ in 0..*group {
            out.push(char::from(HEX[usize::from(b[i] >> 4)]));
            out.push(char::from(HEX[usize::from(b[i] & 0xf)]));
            i += 1;
        }
    }
    out
}

/// Parses one GPU spec.
pub fn parse_gpu(spec: &str) -> Result<GpuLimits, SpecError> {
    let mut parts = spec.split(',');
    let uuid_text = parts.next().unwrap_or_default().trim();
    let uuid = parse_uuid(uuid_text).ok_or_else(|| SpecError::Uuid {
        spec: spec.into(),
        uuid: uuid_text.into(),
    })?;
    let mut g = GpuLimits::unlimited(uuid);
    let mut burst = None;
    for part in parts {
        let bad = |problem: &str| SpecError::Field {
            spec: spec.into(),
            part: part.into(),
            problem: problem.into(),
        };
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| bad("is not key=value"))?;
        let number = |v: &str| -> Result<u64, SpecError> {
            if v == "unlimited" {
                return Ok(UNLIMITED);
            }
            v.parse::<u64>()
                .map_err(|_| bad("needs a whole number or \"unlimited\""))
        };
        let mib = |v: &str| -> Result<u64, SpecError> {
            let n = number(v)?;
            if n == UNLIMITED {
                Ok(n)
            } else {
                n.checked_mul(1 << 20).ok_or_else(|| bad("is too large"))
            }
        };
        match key.trim() {
            "memory" => g.memory_limit = mib(value)?,
            "overhead" => g.context_overhead = mib(value)?.min(1 << 50),
            "rate" => g.launch_rate = number(value)?,
            "burst" => burst = Some(number(value)?),
            "floor" => {
                g.launch_floor = number(value)?;
                if g.launch_floor == UNLIMITED {
                    return Err(bad("needs a whole number of warps"));
                }
            }
            _ => {
                return Err(bad(
                    "has an unknown key; accepted: memory, overhead, rate, burst, floor",
                ));
            }
        }
    }
    g.launch_burst = burst.unwrap_or(if g.launch_rate == UNLIMITED {
        0
    } else {
        (g.launch_rate / 100).max(1)
    });
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: &str = "GPU-5e1a0000-0000-4000-8000-000051510000";

    #[test]
    fn specs_parse() {
        let g = parse_gpu(&format!("{U},memory=4000,overhead=300,rate=20000")).unwrap();
        assert_eq!(g.memory_limit, 4000 << 20);
        assert_eq!(g.context_overhead, 300 << 20);
        assert_eq!(g.launch_rate, 20000);
        assert_eq!(g.launch_burst, 200);
        assert_eq!(g.launch_floor, 0);
        assert_eq!(format_uuid(&g.uuid), U);
        let g = parse_gpu(&format!("{U},rate=20000,floor=8448")).unwrap();
        assert_eq!(g.launch_floor, 8448);
        let g = parse_gpu(U).unwrap();
        assert_eq!(g.memory_limit, UNLIMITED);
        assert_eq!(g.launch_rate, UNLIMITED);
    }

    #[test]
    fn errors_name_the_part() {
        let e = parse_gpu("GPU-nope").unwrap_err().to_string();
        assert!(e.contains("\"GPU-nope\" is not a GPU UUID"), "{e}");
        let e = parse_gpu(&format!("{U},memory=lots"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"memory=lots\" needs a whole number"), "{e}");
        let e = parse_gpu(&format!("{U},colour=red"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown key"), "{e}");
        let e = parse_gpu(&format!("{U},floor=unlimited"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"floor=unlimited\" needs a whole number of warps"),
            "{e}"
        );
    }

    /// The text form built the slow, obvious way: the oracle of the codec.
    fn spelled(b: &[u8; 16]) -> String {
        let h: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
        let h = h.concat();
        format!(
            "GPU-{}-{}-{}-{}-{}",
            &h[0..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..32]
        )
    }

    proptest::proptest! {
        #[test]
        fn uuids_round_trip_through_their_text(bytes in proptest::array::uniform16(proptest::num::u8::ANY)) {
            let text = format_uuid(&bytes);
            proptest::prop_assert_eq!(&text, &spelled(&bytes));
            proptest::prop_assert_eq!(parse_uuid(&text), Some(bytes));
            proptest::prop_assert_eq!(parse_uuid(&text.to_uppercase()), Some(bytes));
        }

        #[test]
        fn any_one_changed_character_is_judged_like_the_form(
            bytes in proptest::array::uniform16(proptest::num::u8::ANY),
            at in 0usize..40,
            with in proptest::char::range(' ', '~'),
        ) {
            let mut text: Vec<char> = spelled(&bytes).chars().collect();
            text[at] = with;
            let text: String = text.into_iter().collect();
            // The form, judged by position: a dash at 12, 17, 22, 27; hex
            // digits elsewhere after the (any-case) prefix.
            let ok = text[..4].eq_ignore_ascii_case("GPU-")
                && text.char_indices().skip(4).all(|(i, c)| {
                    if [12, 17, 22, 27].contains(&i) { c == '-' } else { c.is_ascii_hexdigit() }
                });
            proptest::prop_assert_eq!(parse_uuid(&text).is_some(), ok, "{}", text);
        }
    }

    #[test]
    fn malformed_uuids_are_refused() {
        for bad in [
            "",
            "GPU-",
            "GPU-5e1a0000-0000-4000-8000-00005151000",
            "GPU-5e1a0000-0000-4000-8000-0000515100000",
            "GPU-5e1a00000000-4000-8000-000051510000-",
            "MIG-5e1a0000-0000-4000-8000-000051510000",
            "GPU-5e1a0000-0000-4000-8000-00005151000é",
        ] {
            assert_eq!(parse_uuid(bad), None, "{bad:?}");
        }
    }
}
