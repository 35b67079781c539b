//! Incremental detokenization and stop strings.
//!
//! Each token maps to its exact bytes (the tokenizer's byte table). A sample's bytes are
//! appended as tokens arrive; only whole UTF-8 code points leave (an incomplete tail waits for
//! the next token; an invalid sequence becomes U+FFFD, as `tokenizer.decode` would show it).
//! Text that could still be the beginning of a stop string is held back until it either
//! completes the stop string (then it is never emitted) or stops matching.
//!
//! Buffers are sized at admission; steady-state streaming does not allocate.

/// Exact bytes of every token id, in one flat buffer.
#[derive(Debug, Clone, Default)]
pub struct TokenTable {
    bytes: Vec<u8>,
    /// `offsets[id]..offsets[id + 1]` are the bytes of `id`.
    offsets: Vec<u32>,
    special: Vec<bool>,
    longest: usize,
    strip_leading_space: bool,
}

impl TokenTable {
    /// A table from `(bytes, is_special)` for ids `0..`.
    pub fn new<'a>(tokens: impl IntoIterator<Item = (&'a [u8], bool)>) -> Self {
        let mut t = TokenTable {
            offsets: vec![0],
            ..TokenTable::default()
        };
        for (b, special) in tokens {
            t.bytes.extend_from_slice(b);
            t.offsets.push(t.bytes.len() as u32);
            t.special.push(special);
            t.longest = t.longest.max(b.len());
        }
        t
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        self.special.len()
    }

    /// True when the table has no ids.
    pub fn is_empty(&self) -> bool {
        self.special.is_empty()
    }

    /// Bytes of `id` (empty for ids beyond the table, e.g. padded vocabulary rows).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i + 1 >= self.offsets.len() {
            return &[];
        }
        &self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    /// Whether `id` is a special (control) token; its text is not streamed.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// Longest token in bytes.
    pub fn longest(&self) -> usize {
        self.longest
    }

    /// The tokenizer's decoder drops one leading space of a decoded text (SentencePiece).
    pub fn strip_leading_space(&self) -> bool {
        self.strip_leading_space
    }

    /// Say whether the decoder drops one leading space.
    pub fn set_strip_leading_space(&mut self, strip: bool) {
        self.strip_leading_space = strip;
    }
}

/// What pushing one token produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// `text()[..n]` may be emitted now.
    Emit(usize),
    /// A stop string completed: emit `text()[..n]` and finish (the rest is dropped).
    Stop(usize),
}

/// Per-sample incremental text state.
#[derive(Debug, Default)]
pub struct TextStream {
    /// Bytes of an incomplete UTF-8 code point.
    partial: Vec<u8>,
    /// Decoded text not yet emitted (held back while it may start a stop string).
    held: String,
    /// Stop strings of the request.
    stops: Vec<String>,
    /// Bytes of `held` emitted by the last `push` (drained on the next push).
    emitted: usize,
    /// Drop one leading space of the whole text (SentencePiece decoders do).
    strip_leading_space: bool,
    /// Some text was decoded already.
    started: bool,
}

impl TextStream {
    /// State for a sample with these stop strings; buffers sized for `longest_token` bytes.
    pub fn new(stops: &[String], longest_token: usize) -> Self {
        let longest_stop = stops.iter().map(String::len).max().unwrap_or(0);
        TextStream {
            partial: Vec::with_capacity(longest_token + 8),
            // Held text never exceeds one stop string plus the text of one token (each byte
            // becomes at most 3 bytes as U+FFFD).
            held: String::with_capacity(longest_stop + 3 * (longest_token + 4) + 8),
            stops: stops.to_vec(),
            emitted: 0,
            strip_leading_space: false,
            started: false,
        }
    }

    /// Drop one leading space of the whole text, as SentencePiece decoders do.
    pub fn with_strip_leading_space(mut self, strip: bool) -> Self {
        self.strip_leading_space = strip;
        self
    }

    /// Reset for reuse with other stop strings (admission time; may allocate).
    pub fn reset(&mut self, stops: &[String], longest_token: usize, strip_leading_space: bool) {
        *self = TextStream::new(stops, longest_token).with_strip_leading_space(strip_leading_space);
    }

    /// The decoded, not yet emitted text; `Pushed` says how much of it to emit.
    pub fn text(&self) -> &str {
        &self.held
    }

    fn drain_emitted(&mut self) {
        if self.emitted > 0 {
            self.held.drain(..self.emitted);
            self.emitted = 0;
        }
    }

    /// Append one token's bytes.
    pub fn push(&mut self, bytes: &[u8]) -> Pushed {
        self.drain_emitted();
        self.partial.extend_from_slice(bytes);
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.partial[start..]) {
                Ok(s) => {
                    self.held.push_str(s);
                    start = self.partial.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    let ok = &self.partial[start..start + valid];
                    // SAFETY-free: `valid_up_to` bytes are valid UTF-8 by definition.
                    self.held
                        .push_str(std::str::from_utf8(ok).unwrap_or_default());
                    match e.error_len() {
                        // Incomplete code point at the end: wait for more bytes.
                        None => {
                            start += valid;
                            break;
                        }
                        Some(bad) => {
                            self.held.push('\u{FFFD}');
                            start += valid + bad;
                        }
                    }
                }
            }
        }
        self.partial.drain(..start);
        if !self.started && !self.held.is_empty() {
            self.started = true;
            if self.strip_leading_space && self.held.starts_with(' ') {
                self.held.remove(0);
            }
        }
        self.scan()
    }

    /// Decide what of `held` can go out.
    fn scan(&mut self) -> Pushed {
        let mut first: Option<usize> = None;
        for s in &self.stops {
            if s.is_empty() {
                continue;
            }
            if let Some(i) = self.held.find(s.as_str()) {
                first = Some(first.map_or(i, |f: usize| f.min(i)));
            }
        }
        if let Some(i) = first {
            self.emitted = self.held.len();
            return Pushed::Stop(i);
        }
        // Hold the longest suffix that is a proper prefix of a stop string.
        let mut keep = 0;
        for s in &self.stops {
            let max = s.len().saturating_sub(1).min(self.held.len());
            for n in (keep + 1..=max).rev() {
                let from = self.held.len() - n;
                if self.held.is_char_boundary(from) && s.starts_with(&self.held[from..]) {
                    keep = n;
                    break;
                }
            }
        }
        let n = self.held.len() - keep;
        self.emitted = n;
        Pushed::Emit(n)
    }

    /// At the end of a sample (no stop string matched): everything still held, with an
    /// incomplete code point shown as U+FFFD. Returns how many bytes of `text()` to emit.
    pub fn finish(&mut self) -> usize {
        self.drain_emitted();
        if !self.partial.is_empty() {
            self.held.push('\u{FFFD}');
            self.partial.clear();
        }
        self.emitted = self.held.len();
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(stops: &[&str], pieces: &[&[u8]]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut t = TextStream::new(&stops, 8);
        let mut out = String::new();
        for p in pieces {
            match t.push(p) {
                Pushed::Emit(n) => out.push_str(&t.text()[..n]),
                Pushed::Stop(n) => {
                    out.push_str(&t.text()[..n]);
                    return (out, true);
                }
            }
        }
        let n = t.finish();
        out.push_str(&t.text()[..n]);
        (out, false)
    }

    #[test]
    fn utf8_never_split() {
        let snow = "☃".as_bytes(); // 3 bytes
        let stops: Vec<String> = vec![];
        let mut t = TextStream::new(&stops, 8);
        assert_eq!(t.push(&snow[..1]), Pushed::Emit(0));
        assert_eq!(t.push(&snow[1..2]), Pushed::Emit(0));
        assert_eq!(t.push(&snow[2..]), Pushed::Emit(3));
        assert_eq!(&t.text()[..3], "☃");
    }

    #[test]
    fn invalid_bytes_become_replacement() {
        assert_eq!(stream(&[], &[b"a\xffb"]).0, "a\u{FFFD}b");
        assert_eq!(stream(&[], &[b"a\xe2\x98"]).0, "a\u{FFFD}");
    }

    #[test]
    fn stop_string_across_tokens_is_not_emitted() {
        let (out, stopped) = stream(&["STOP"], &[b"hello S", b"T", b"OP and more"]);
        assert!(stopped);
        assert_eq!(out, "hello ");
    }

    #[test]
    fn partial_match_that_fails_is_released() {
        let (out, stopped) = stream(&["STOP"], &[b"ST", b"ART", b"!"]);
        assert!(!stopped);
        assert_eq!(out, "START!");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let (out, stopped) = stream(&["bb", "a b"], &[b"xa", b" bb"]);
        assert!(stopped);
        assert_eq!(out, "x");
    }

    #[test]
    fn held_prefix_released_at_finish() {
        let (out, stopped) = stream(&["\n\n"], &[b"line\n"]);
        assert!(!stopped);
        assert_eq!(out, "line\n");
    }

    #[test]
    fn sentencepiece_leading_space_dropped_once() {
        let mut t = TextStream::new(&[], 4).with_strip_leading_space(true);
        assert_eq!(t.push(b" a"), Pushed::Emit(1));
        assert_eq!(&t.text()[..1], "a");
        assert_eq!(t.push(b" b"), Pushed::Emit(2));
        assert_eq!(&t.text()[..2], " b");
    }

    #[test]
    fn token_table_lookup() {
        let t = TokenTable::new([(&b"ab"[..], false), (&b""[..], true), (&b"c"[..], false)]);
        assert_eq!(t.token_bytes(0), b"ab");
        assert_eq!(t.token_bytes(2), b"c");
        assert_eq!(t.token_bytes(3), b"");
        assert!(t.is_special(1));
        assert!(!t.is_special(9));
        assert_eq!(t.longest(), 2);
    }
}
