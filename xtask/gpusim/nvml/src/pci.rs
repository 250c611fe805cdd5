//! PCI identity of a simulated GPU: `nvmlPciInfo_t` and bus id matching.
//!
//! The bus id comes from the node description (`pci_bus_id`, or the one
//! derived from the index). As NVML does, `busId` is printed with an
//! 8-digit domain and `busIdLegacy` with a 4-digit one, upper-case hex
//! (see [`gpusim::pci`]).
//! The subsystem id repeats the device id (an NVIDIA-branded board; the
//! node description has no field for it).

use std::ffi::c_char;

use gpusim::NodeDescription;
use gpusim::pci::PciAddress;

use crate::abi::{PCI_BUS_ID_BUFFER_SIZE, PCI_BUS_ID_LEGACY_BUFFER_SIZE, PciInfo};

/// The `nvmlPciInfo_t` of GPU `gpu`.
pub fn info(node: &NodeDescription, gpu: usize) -> PciInfo {
    let a = node.pci_address(gpu);
    let id = node.gpu[gpu].pci_device_id;
    PciInfo {
        bus_id_legacy: c_chars(&a.nvml_legacy()),
        domain: a.domain,
        bus: a.bus,
        device: a.device,
        pci_device_id: id,
        pci_sub_system_id: id,
        bus_id: c_chars(&a.nvml()),
    }
}

/// The GPU whose bus id `text` names. Accepts what NVML accepts: any case,
/// any domain width, no domain (`18:00.0`) or no function (`0:18:00`).
pub fn find(node: &NodeDescription, text: &str) -> Option<usize> {
    let wanted = PciAddress::parse(text)?;
    (0..node.gpu.len()).find(|&i| node.pci_address(i) == wanted)
}

/// `s` as a NUL-terminated C char array (truncated to fit).
fn c_chars<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *o = b as c_char;
    }
    out
}

const _: () = assert!(PCI_BUS_ID_BUFFER_SIZE > 16 && PCI_BUS_ID_LEGACY_BUFFER_SIZE == 16);

#[cfg(test)]
mod tests {
    use super::*;

    fn text(chars: &[c_char]) -> String {
        chars
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8 as char)
            .collect()
    }

    #[test]
    fn bus_ids_are_formatted_as_nvml_does() {
        let mut node = NodeDescription::default_node();
        node.gpu[1].pci_bus_id = Some("0000:3b:1f.0".into());
        let p = info(&node, 1);
        assert_eq!(text(&p.bus_id), "00000000:3B:1F.0");
        assert_eq!(text(&p.bus_id_legacy), "0000:3B:1F.0");
        assert_eq!((p.domain, p.bus, p.device), (0, 0x3b, 0x1f));
        assert_eq!(p.pci_device_id, 0x2330_10de);
        assert_eq!(text(&info(&node, 0).bus_id), "00000000:18:00.0");
    }

    #[test]
    fn bus_ids_are_found_in_any_spelling() {
        let mut node = NodeDescription::default_node();
        node.gpu[1].pci_bus_id = Some("0000:3b:00.0".into());
        assert_eq!(find(&node, "00000000:3B:00.0"), Some(1));
        assert_eq!(find(&node, "0000:3b:00.0"), Some(1));
        assert_eq!(find(&node, "3b:00.0"), Some(1));
        assert_eq!(find(&node, "00000000:18:00.0"), Some(0));
        assert_eq!(find(&node, "00000000:19:00.0"), None);
        assert_eq!(find(&node, "nonsense"), None);
    }
}
