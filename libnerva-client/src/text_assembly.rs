//! Reassembling UTF-8 text pieces: the daemon sends whole code points, but the client does not
//! rely on it — a code point split across two `TEXT` completions is held back and joined, and
//! invalid bytes become U+FFFD, so the application only ever sees valid, unsplit text.

use std::collections::HashMap;

/// Per-(request, sample) carry of an incomplete trailing code point.
#[derive(Debug, Default)]
pub struct TextAssembler {
    carry: HashMap<(u64, u16), Vec<u8>>,
    out: String,
}

impl TextAssembler {
    /// Join `bytes` to whatever was held back for `(tag, sample)` and return the text that is
    /// complete now (possibly empty).
    pub fn push(&mut self, tag: u64, sample: u16, bytes: &[u8]) -> &str {
        self.out.clear();
        let held = self.carry.remove(&(tag, sample));
        let joined: std::borrow::Cow<'_, [u8]> = match held {
            Some(mut h) => {
                h.extend_from_slice(bytes);
                h.into()
            }
            None => bytes.into(),
        };
        let mut rest: &[u8] = &joined;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    self.out.push_str(s);
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // SAFETY-free: `valid_up_to` bytes are valid UTF-8 by definition.
                    self.out
                        .push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        // Incomplete sequence at the end: keep it for the next piece.
                        None => {
                            self.carry.insert((tag, sample), bad.to_vec());
                            break;
                        }
                        Some(n) => {
                            self.out.push(char::REPLACEMENT_CHARACTER);
                            rest = &bad[n..];
                        }
                    }
                }
            }
        }
        &self.out
    }

    /// The sample ended: whatever is still held back can never complete; returns it as
    /// replacement characters (empty when nothing was held).
    pub fn finish(&mut self, tag: u64, sample: u16) -> &str {
        self.out.clear();
        if self.carry.remove(&(tag, sample)).is_some() {
            self.out.push(char::REPLACEMENT_CHARACTER);
        }
        &self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_split_code_points_and_replaces_garbage() {
        let mut t = TextAssembler::default();
        let rocket = "🚀".as_bytes();
        assert_eq!(t.push(1, 0, &[b'a', rocket[0], rocket[1]]), "a");
        assert_eq!(t.push(1, 1, b"other sample"), "other sample");
        assert_eq!(t.push(1, 0, &[rocket[2], rocket[3], b'b']), "🚀b");
        assert_eq!(t.push(2, 0, &[b'x', 0xff, b'y']), "x\u{fffd}y");
        assert_eq!(t.push(3, 0, &[0xe6]), "");
        assert_eq!(t.finish(3, 0), "\u{fffd}");
        assert_eq!(t.finish(1, 0), "");
    }
}
