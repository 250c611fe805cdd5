//! GPU UUIDs: 16 bytes, written `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`
//! as NVML prints them (lower-case hex). Reading accepts the prefix and the
//! hex digits in any case; writing is always the canonical form, so two
//! spellings of one GPU compare equal once parsed. The text codec is the
//! region ABI's (`tessera_region::spec`), so the interposer, the agent and
//! the scheduler read UUIDs the same way.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The JSON-schema pattern of the canonical form (the CRD's validation).
pub const PATTERN: &str =
    "^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";

/// The accepted form, for error messages.
pub const FORM: &str = "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (hex)";

/// One GPU's UUID.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuUuid([u8; 16]);

/// Text that is not a GPU UUID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a GPU UUID; expected {FORM}")]
pub struct UuidError {
    /// The text as given.
    pub text: String,
}

impl GpuUuid {
    /// The UUID of these bytes (as NVML and `cuDeviceGetUuid` return them).
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// Its 16 bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl FromStr for GpuUuid {
    type Err = UuidError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        tessera_region::spec::parse_uuid(s)
            .map(Self)
            .ok_or_else(|| UuidError { text: s.to_owned() })
    }
}

impl fmt::Display for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&tessera_region::spec::format_uuid(&self.0))
    }
}

impl fmt::Debug for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for GpuUuid {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GpuUuid {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = Cow::<str>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for GpuUuid {
    fn schema_name() -> Cow<'static, str> {
        "GpuUuid".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": PATTERN,
            "description": "GPU UUID as NVML reports it.",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NVML: &str = "GPU-5f8b9d2e-1c3a-4e6f-8a9b-0c1d2e3f4a5b";

    #[test]
    fn round_trips_the_canonical_form() {
        let u: GpuUuid = NVML.parse().unwrap();
        assert_eq!(u.to_string(), NVML);
        assert_eq!(u.as_bytes()[0], 0x5f);
        assert_eq!(u.as_bytes()[15], 0x5b);
        assert_eq!(GpuUuid::from_bytes(*u.as_bytes()), u);
    }

    #[test]
    fn reads_any_case_and_writes_lower_case() {
        let upper: GpuUuid = "gpu-5F8B9D2E-1C3A-4E6F-8A9B-0C1D2E3F4A5B".parse().unwrap();
        assert_eq!(upper.to_string(), NVML);
    }

    #[test]
    fn refuses_malformed_text_naming_it() {
        for bad in [
            "",
            "GPU-",
            "MIG-5f8b9d2e-1c3a-4e6f-8a9b-0c1d2e3f4a5b",
            "GPU-5f8b9d2e-1c3a-4e6f-8a9b-0c1d2e3f4a5",
            "GPU-5f8b9d2e-1c3a-4e6f-8a9b-0c1d2e3f4a5bb",
            "GPU-5f8b9d2e-1c3a-4e6f-8a9b-0c1d2e3f4a5b-00",
            "GPU-5f8b9d2e1c3a-4e6f-8a9b-0c1d2e3f4a5b",
            "GPU-5f8b9d2e-1c3a-4e6f-8a9b-0c1d2e3f4a5g",
            "GPU-+f8b9d2e-1c3a-4e6f-8a9b-0c1d2e3f4a5b",
            "GPU-5f8b9d2é-1c3a-4e6f-8a9b-0c1d2e3f4a5",
        ] {
            let e = bad.parse::<GpuUuid>().unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn serde_uses_the_text_form() {
        let u: GpuUuid = NVML.parse().unwrap();
        assert_eq!(serde_json::to_string(&u).unwrap(), format!("\"{NVML}\""));
        let back: GpuUuid = serde_json::from_str(&format!("\"{NVML}\"")).unwrap();
        assert_eq!(back, u);
        let e = serde_json::from_str::<GpuUuid>("\"GPU-1\"").unwrap_err();
        assert!(e.to_string().contains("not a GPU UUID"), "{e}");
    }
}
