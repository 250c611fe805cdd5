//! Kubernetes quantity strings for Tessera's whole-number resources.
//!
//! Every `nvidia.com/*` resource Tessera reads is an extended resource, and
//! Kubernetes only admits whole numbers for those. So this module accepts any
//! quantity spelling Kubernetes itself accepts (`4000`, `4k`, `4e3`, `+4k`,
//! `4000.0`, `4Ki`) as long as it denotes a non-negative whole number, and
//! returns that number. The API server canonicalises quantities before a
//! webhook or extender sees them (`4000` arrives as `"4k"`), so decimal
//! suffixes must be understood, not merely tolerated.
//!
//! Suffixes keep their Kubernetes meaning: `4Ki` is 4096, `1Gi` is
//! 1073741824. For `nvidia.com/gpumem`, a count of MiB, `1Gi` is therefore
//! far out of range and rejected there; write `1024` for one GiB.

use thiserror::Error;

/// Why a quantity string was refused. Messages are phrased to follow the
/// offending value ("\"500m\" is not a whole number").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum QuantityError {
    /// Empty string.
    #[error("is empty")]
    Empty,
    /// Not in the Kubernetes quantity grammar.
    #[error(
        "is not a Kubernetes quantity (digits with an optional k, M, G, T, P, E, Ki..Ei suffix or e<exponent>)"
    )]
    Malformed,
    /// Below zero.
    #[error("is negative")]
    Negative,
    /// Has a fractional part (`0.5`, `500m`).
    #[error("is not a whole number")]
    Fractional,
    /// Larger than 2^64 - 1.
    #[error("is too large")]
    TooLarge,
}

/// Parses `text` as a Kubernetes quantity that must be a non-negative whole
/// number.
///
/// # Errors
/// A [`QuantityError`] saying what is wrong with the value.
pub fn parse_whole(text: &str) -> Result<u64, QuantityError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(QuantityError::Empty);
    }
    let (negative, rest) = split_sign(text);
    let number_len = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_len);
    let (mantissa, frac_digits) = parse_number(number)?;
    let (exp10, exp2) = parse_suffix(suffix)?;
    if negative && mantissa != 0 {
        return Err(QuantityError::Negative);
    }
    scale(mantissa, exp10 - frac_digits, exp2)
}

fn split_sign(text: &str) -> (bool, &str) {
    match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    }
}

/// Digits with at most one dot → (all digits as an integer, digits after
/// the dot). Leading zeros are dropped so long zero runs cannot overflow.
fn parse_number(number: &str) -> Result<(u128, i32), QuantityError> {
    let (int, frac) = match number.split_once('.') {
        Some((int, frac)) => (int, frac),
        None => (number, ""),
    };
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(QuantityError::Malformed);
    }
    let frac = frac.trim_end_matches('0');
    let mut mantissa: u128 = 0;
    for digit in int.bytes().chain(frac.bytes()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(u128::from(digit - b'0')))
            .ok_or(QuantityError::TooLarge)?;
    }
    let frac_digits = i32::try_from(frac.len()).map_err(|_| QuantityError::Malformed)?;
    Ok((mantissa, frac_digits))
}

/// Suffix → (power of ten, power of two).
fn parse_suffix(suffix: &str) -> Result<(i32, u32), QuantityError> {
    let decimal = match suffix {
        "" => Some(0),
        "m" => Some(-3),
        "k" => Some(3),
        "M" => Some(6),
        "G" => Some(9),
        "T" => Some(12),
        "P" => Some(15),
        "E" => Some(18),
        _ => None,
    };
    if let Some(exp10) = decimal {
        return Ok((exp10, 0));
    }
    let binary = match suffix {
        "Ki" => Some(10),
        "Mi" => Some(20),
        "Gi" => Some(30),
        "Ti" => Some(40),
        "Pi" => Some(50),
        "Ei" => Some(60),
        _ => None,
    };
    if let Some(exp2) = binary {
        return Ok((0, exp2));
    }
    let exponent = suffix
        .strip_prefix('e')
        .or_else(|| suffix.strip_prefix('E'))
        .ok_or(QuantityError::Malformed)?;
    let digits = exponent.trim_start_matches(['+', '-']);
    if digits.is_empty()
        || exponent.len() - digits.len() > 1
        || !digits.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(QuantityError::Malformed);
    }
    // Anything past ±1000 is out of every range we accept either way.
    let exp10: i32 = exponent.parse().unwrap_or(if exponent.starts_with('-') {
        -1000
    } else {
        1000
    });
    Ok((exp10.clamp(-1000, 1000), 0))
}

/// mantissa × 10^exp10 × 2^exp2, required to be a whole number within u64.
fn scale(mantissa: u128, exp10: i32, exp2: u32) -> Result<u64, QuantityError> {
    if mantissa == 0 {
        return Ok(0);
    }
    let value = mantissa
        .checked_mul(1u128 << exp2)
        .ok_or(QuantityError::TooLarge)?;
    let value = if exp10 >= 0 {
        let factor = 10u128
            .checked_pow(exp10.unsigned_abs())
            .ok_or(QuantityError::TooLarge)?;
        value.checked_mul(factor).ok_or(QuantityError::TooLarge)?
    } else {
        // A divisor beyond u128 is larger than any mantissa: a fraction.
        let divisor = 10u128
            .checked_pow(exp10.unsigned_abs())
            .ok_or(QuantityError::Fractional)?;
        if value % divisor != 0 {
            return Err(QuantityError::Fractional);
        }
        value / divisor
    };
    u64::try_from(value).map_err(|_| QuantityError::TooLarge)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_signed_integers() {
        assert_eq!(parse_whole("4000"), Ok(4000));
        assert_eq!(parse_whole("+7"), Ok(7));
        assert_eq!(parse_whole("0"), Ok(0));
        assert_eq!(parse_whole("-0"), Ok(0));
        assert_eq!(parse_whole(" 12 "), Ok(12));
        assert_eq!(parse_whole("007"), Ok(7));
    }

    #[test]
    fn decimal_suffixes_as_the_api_server_writes_them() {
        assert_eq!(parse_whole("4k"), Ok(4000));
        assert_eq!(parse_whole("1M"), Ok(1_000_000));
        assert_eq!(parse_whole("2G"), Ok(2_000_000_000));
        assert_eq!(parse_whole("1500m"), Err(QuantityError::Fractional));
        assert_eq!(parse_whole("3000m"), Ok(3));
        assert_eq!(parse_whole("1.5k"), Ok(1500));
        assert_eq!(parse_whole("4000.000"), Ok(4000));
    }

    #[test]
    fn exponents() {
        assert_eq!(parse_whole("4e3"), Ok(4000));
        assert_eq!(parse_whole("4E+3"), Ok(4000));
        assert_eq!(parse_whole("40e-1"), Ok(4));
        assert_eq!(parse_whole("4e-1"), Err(QuantityError::Fractional));
        assert_eq!(parse_whole("1e999999"), Err(QuantityError::TooLarge));
        assert_eq!(parse_whole("1e-999999"), Err(QuantityError::Fractional));
        assert_eq!(parse_whole("4e"), Err(QuantityError::Malformed));
        assert_eq!(parse_whole("4e+-3"), Err(QuantityError::Malformed));
    }

    #[test]
    fn binary_suffixes_keep_their_kubernetes_meaning() {
        assert_eq!(parse_whole("4Ki"), Ok(4096));
        assert_eq!(parse_whole("1Gi"), Ok(1 << 30));
        assert_eq!(parse_whole("0.5Ki"), Ok(512));
        assert_eq!(parse_whole("16Ei"), Err(QuantityError::TooLarge));
    }

    #[test]
    fn rejected_values_say_why() {
        assert_eq!(parse_whole(""), Err(QuantityError::Empty));
        assert_eq!(parse_whole("500m"), Err(QuantityError::Fractional));
        assert_eq!(parse_whole("0.5"), Err(QuantityError::Fractional));
        assert_eq!(parse_whole("-1"), Err(QuantityError::Negative));
        assert_eq!(parse_whole("four"), Err(QuantityError::Malformed));
        assert_eq!(parse_whole("4 k"), Err(QuantityError::Malformed));
        assert_eq!(parse_whole("4kk"), Err(QuantityError::Malformed));
        assert_eq!(parse_whole("1.2.3"), Err(QuantityError::Malformed));
        assert_eq!(parse_whole("."), Err(QuantityError::Malformed));
        assert_eq!(parse_whole("4KB"), Err(QuantityError::Malformed));
        assert_eq!(
            parse_whole("99999999999999999999999"),
            Err(QuantityError::TooLarge)
        );
        assert_eq!(parse_whole("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(
            parse_whole("18446744073709551616"),
            Err(QuantityError::TooLarge)
        );
    }

    #[test]
    fn messages_are_lower_case_phrases() {
        assert_eq!(
            QuantityError::Fractional.to_string(),
            "is not a whole number"
        );
        assert!(QuantityError::Malformed.to_string().starts_with("is not"));
    }
}
