//! PCI bus ids: the one parser and the formats CUDA and NVML print.
//!
//! Both libraries accept an id in any of the forms CUDA documents for
//! `cuDeviceGetByPCIBusId` and NVML for `nvmlDeviceGetHandleByPciBusId`:
//! `domain:bus:device.function`, `domain:bus:device` (function 0) and
//! `bus:device.function` (domain 0), in hex of any case.

use std::fmt;

/// A PCI address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PciAddress {
    /// Domain (segment).
    pub domain: u32,
    /// Bus (0 to 0xff).
    pub bus: u32,
    /// Device (slot, 0 to 0x1f).
    pub device: u32,
    /// Function (0 to 7).
    pub function: u32,
}

impl PciAddress {
    /// Parses any accepted form (surrounding whitespace ignored); each
    /// field is 1 to 8 hex digits (1 for the function) within its range.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let parts: Vec<&str> = text.split(':').collect();
        let (domain, bus, rest) = match parts[..] {
            [d, b, rest] => (hex(d)?, b, rest),
            [b, rest] => (0, b, rest),
            _ => return None,
        };
        let (device, function) = match rest.split_once('.') {
            Some((v, f)) if f.len() == 1 => (v, hex(f)?),
            Some(_) => return None,
            // Only the domain form may leave out the function.
            None if parts.len() == 3 => (rest, 0),
            None => return None,
        };
        let a = Self {
            domain,
            bus: hex(bus)?,
            device: hex(device)?,
            function,
        };
        (a.bus <= 0xff && a.device < 32 && a.function < 8).then_some(a)
    }

    /// As `nvmlPciInfo_t.busId` prints it: `00000000:3B:00.0`.
    pub fn nvml(&self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }

    /// As `nvmlPciInfo_t.busIdLegacy` prints it: `0000:3B:00.0`.
    pub fn nvml_legacy(&self) -> String {
        format!(
            "{:04X}:{:02X}:{:02X}.{:X}",
            self.domain & 0xffff,
            self.bus,
            self.device,
            self.function
        )
    }
}

/// As `cuDeviceGetPCIBusId` prints it: `0000:3b:00.0`.
impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// 1 to 8 hex digits.
fn hex(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 8 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(domain: u32, bus: u32, device: u32, function: u32) -> Option<PciAddress> {
        Some(PciAddress {
            domain,
            bus,
            device,
            function,
        })
    }

    #[test]
    fn every_documented_form_parses() {
        assert_eq!(PciAddress::parse("00000000:18:00.0"), a(0, 0x18, 0, 0));
        assert_eq!(PciAddress::parse("0000:3b:1f.7"), a(0, 0x3b, 0x1f, 7));
        assert_eq!(PciAddress::parse("0001:3B:00"), a(1, 0x3b, 0, 0));
        assert_eq!(PciAddress::parse("3b:00.1"), a(0, 0x3b, 0, 1));
        assert_eq!(PciAddress::parse(" 0:5e:0.0\n"), a(0, 0x5e, 0, 0));
    }

    #[test]
    fn malformed_or_out_of_range_ids_do_not() {
        for bad in [
            "",
            "garbage",
            "3b:00",
            "0000:3b:20.0",
            "0000:3b:00.8",
            "0000:100:00.0",
            "0000:3b:00.00",
            "0:0:3b:00.0",
            "000000000:3b:00.0",
            "0000:+3b:00.0",
            "0000:3b::0",
        ] {
            assert_eq!(PciAddress::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn formats_follow_each_library() {
        let x = PciAddress::parse("0000:3b:1f.0").unwrap();
        assert_eq!(x.nvml(), "00000000:3B:1F.0");
        assert_eq!(x.nvml_legacy(), "0000:3B:1F.0");
        assert_eq!(x.to_string(), "0000:3b:1f.0");
    }
}
