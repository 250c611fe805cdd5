//! Parsing per-GPU limits from text, for `tessera-agent region` and
//! tests: `GPU-<uuid>[,memory=<MiB>][,overhead=<MiB>][,rate=<warps/s>][,burst=<warps>]`.
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
    let rest = s
        .get(..4)
        .filter(|p| p.eq_ignore_ascii_case("GPU-"))
        .map(|_| &s[4..])?;
    let groups: Vec<&str> = rest.split('-').collect();
    if groups.len() != 5
        || groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .any(|(g, n)| g.len() != n || !g.chars().all(|c| c.is_ascii_hexdigit()))
    {
        return None;
    }
    let hex: String = groups.concat();
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Formats a UUID as `GPU-…`.
pub fn format_uuid(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
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
            _ => {
                return Err(bad(
                    "has an unknown key; accepted: memory, overhead, rate, burst",
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
        assert_eq!(format_uuid(&g.uuid), U);
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
    }
}
