//! An incremental server-sent events decoder: bytes in, the `data` of each event out.

/// Decodes an SSE byte stream fed in arbitrary pieces.
///
/// Lines end with CRLF, LF or a lone CR (a CRLF split across two pieces is still one line
/// end); an event ends at a blank line; its `data:` lines are joined with `\n`; lines
/// starting with `:` are comments (keep-alives); other fields are ignored. An event left
/// unterminated when the stream ends is discarded, as the SSE spec says.
#[derive(Debug, Default)]
pub struct SseDecoder {
    line: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    after_cr: bool,
}

impl SseDecoder {
    /// A decoder at the start of a stream.
    pub fn new() -> SseDecoder {
        SseDecoder::default()
    }

    /// Feeds `bytes`; appends the data of every event they complete to `events`.
    pub fn push(&mut self, bytes: &[u8], events: &mut Vec<String>) {
        for &b in bytes {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' => self.end_line(events),
                b'\r' => {
                    self.end_line(events);
                    self.after_cr = true;
                }
                _ => self.line.push(b),
            }
        }
    }

    /// Whether bytes of an unfinished event are buffered.
    pub fn has_partial_event(&self) -> bool {
        self.has_data || !self.line.is_empty()
    }

    fn end_line(&mut self, events: &mut Vec<String>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            if self.has_data {
                events.push(String::from_utf8_lossy(&self.data).into_owned());
            }
            self.data.clear();
            self.has_data = false;
        } else if line[0] != b':' {
            let (field, value) = match line.iter().position(|&b| b == b':') {
                Some(i) => {
                    let value = &line[i + 1..];
                    (&line[..i], value.strip_prefix(b" ").unwrap_or(value))
                }
                None => (&line[..], &[][..]),
            };
            if field == b"data" {
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
        }
        self.line = line;
        self.line.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck::{Gen, QuickCheck};

    fn decode(pieces: &[&[u8]]) -> Vec<String> {
        let mut decoder = SseDecoder::new();
        let mut events = Vec::new();
        for piece in pieces {
            decoder.push(piece, &mut events);
        }
        events
    }

    #[test]
    fn every_line_ending_and_comments() {
        let text = b": keep-alive\r\ndata: a\r\n\r\ndata: b\rdata: c\r\rdata:d\n\n: OPENROUTER PROCESSING\n\ndata: [DONE]\n\n";
        assert_eq!(decode(&[text]), ["a", "b\nc", "d", "[DONE]"]);
    }

    #[test]
    fn an_unterminated_event_is_not_emitted() {
        let mut decoder = SseDecoder::new();
        let mut events = Vec::new();
        decoder.push(b"data: {\"partial\":", &mut events);
        assert!(events.is_empty());
        assert!(decoder.has_partial_event());
    }

    #[test]
    fn a_crlf_split_between_pieces_is_one_line_end() {
        assert_eq!(decode(&[b"data: x\r", b"\n\r", b"\n"]), ["x"]);
    }

    fn splitting_never_changes_the_events(cuts: Vec<u16>) -> bool {
        let text: &[u8] = b"data: {\"a\":1}\r\n\r\n: ping\n\ndata: line1\ndata: line2\n\rdata: x\r\rdata: [DONE]\r\n\r\n";
        let whole = decode(&[text]);
        let mut points: Vec<usize> = cuts
            .iter()
            .map(|c| *c as usize % (text.len() + 1))
            .collect();
        points.sort_unstable();
        let mut pieces = Vec::new();
        let mut start = 0;
        for p in points {
            pieces.push(&text[start..p]);
            start = p;
        }
        pieces.push(&text[start..]);
        decode(&pieces) == whole
    }

    #[test]
    fn any_split_of_the_stream_decodes_the_same() {
        QuickCheck::new()
            .rng(Gen::from_size_and_seed(40, 0x55e))
            .tests(500)
            .quickcheck(splitting_never_changes_the_events as fn(Vec<u16>) -> bool);
    }
}
