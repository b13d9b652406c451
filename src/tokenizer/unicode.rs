//! Codepoint categories exactly as llama.cpp's `unicode.cpp` sees them (its tables, its Unicode
//! version), and the GPT-2 byte <-> unicode mapping of byte-level BPE.

use super::unicode_data::{FLAG_RANGES, WHITESPACE};

pub(super) const NUMBER: u8 = 0x02;
pub(super) const LETTER: u8 = 0x04;
pub(super) const MARK: u8 = 0x10;
pub(super) const PUNCTUATION: u8 = 0x20;

/// llama.cpp's `unicode_cpt_flags` reduced to what the splitters read. `Flags::NONE` is what its
/// `_get_flags` returns past the end of a fragment (all bits clear).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Flags {
    pub cat: u8,
    pub ws: bool,
}

impl Flags {
    pub const NONE: Flags = Flags { cat: 0, ws: false };

    pub fn of(cpt: u32) -> Flags {
        // the table's ranges are sorted by their first codepoint; the last entry is 0x110000
        let i = FLAG_RANGES.partition_point(|&(start, _)| start <= cpt);
        let cat = if i == 0 || i >= FLAG_RANGES.len() {
            0x01
        } else {
            FLAG_RANGES[i - 1].1
        };
        let ws = WHITESPACE.binary_search(&cpt).is_ok();
        Flags { cat, ws }
    }

    pub fn is_letter(self) -> bool {
        self.cat & LETTER != 0
    }
    pub fn is_number(self) -> bool {
        self.cat & NUMBER != 0
    }
    /// `\p{M}` (llama.cpp's `is_accent_mark`).
    pub fn is_mark(self) -> bool {
        self.cat & MARK != 0
    }
    /// `flags.as_uint() != 0`: any bit set. Every codepoint in range has a category bit (the
    /// generator asserts it), so this is "inside the fragment".
    pub fn any(self) -> bool {
        self.cat != 0 || self.ws
    }
}

/// GPT-2's `bytes_to_unicode`: printable bytes map to themselves, the others to U+0100.. in
/// byte order (llama.cpp `unicode_byte_to_utf8_map`).
pub(super) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let mut n = 0;
    for b in 0..256u32 {
        table[b as usize] = if printable(b) {
            char::from_u32(b).unwrap()
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap()
        };
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn categories_follow_llama_cpp_tables() {
        assert!(
            Flags::of('a' as u32).is_letter()
                && Flags::of('é' as u32).is_letter()
                && Flags::of('中' as u32).is_letter()
        );
        assert!(
            Flags::of('7' as u32).is_number()
                && Flags::of('٣' as u32).is_number()
                && Flags::of('Ⅻ' as u32).is_number()
        );
        assert!(
            Flags::of(' ' as u32).ws
                && Flags::of(0x3000).ws
                && Flags::of(0x85).ws
                && !Flags::of('a' as u32).ws
        );
        assert_eq!(Flags::of(',' as u32).cat, PUNCTUATION);
        assert_eq!(Flags::of(0x301).cat, MARK); // combining acute: \p{M}
        assert!(Flags::of(0x301).is_mark() && !Flags::of('e' as u32).is_mark());
        assert_eq!(
            Flags::of(0x110000),
            Flags {
                cat: 0x01,
                ws: false
            }
        ); // past Unicode: undefined
        assert!(!Flags::NONE.any() && Flags::of(0x10FFFD).any());
    }

    #[test]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn gpt2_byte_mapping() {
        let t = byte_to_char_table();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[0xAD], 'Ń'); // the soft hyphen, the 68th unprintable byte: U+0100 + 67
        let mut all: Vec<char> = t.to_vec();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 256);
    }
}
