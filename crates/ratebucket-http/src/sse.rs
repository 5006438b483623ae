//! An incremental server-sent events decoder: bytes in, the `data` of each event out.

/// Decodes an SSE byte stream fed in arbitrary pieces.
///
/// Lines end with CRLF, LF or a lone CR (a CRLF split across two pieces is still one line
/// end); an event ends at a blank line; its `data:` lines are joined with `\n`; lines
/// starting with `:` are comments (keep-alives); other fields are ignored. A UTF-8 byte
/// order mark opening the stream is skipped, as the spec says. An event left unterminated
/// when the stream ends is discarded. Memory is bounded: an event (or a line) longer than
/// the limit is an [`EventTooLarge`] error, not a buffer that grows with the flood.
#[derive(Debug)]
pub struct SseDecoder {
    line: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    after_cr: bool,
    /// Bytes of the byte order mark matched so far, until the first byte that is not one.
    bom: Option<usize>,
    max_event: usize,
}

/// An event or a line longer than the decoder's limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventTooLarge {
    /// The limit, in bytes.
    pub limit: usize,
}

impl std::fmt::Display for EventTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a server-sent event longer than {} bytes", self.limit)
    }
}

impl std::error::Error for EventTooLarge {}

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

impl Default for SseDecoder {
    fn default() -> SseDecoder {
        SseDecoder::with_limit(16 << 20)
    }
}

impl SseDecoder {
    /// A decoder at the start of a stream, accepting events of up to 16 MiB.
    pub fn new() -> SseDecoder {
        SseDecoder::default()
    }

    /// A decoder accepting events (and lines) of up to `max_event` bytes.
    pub fn with_limit(max_event: usize) -> SseDecoder {
        SseDecoder {
            line: Vec::new(),
            data: Vec::new(),
            has_data: false,
            after_cr: false,
            bom: Some(0),
            max_event,
        }
    }

    /// Feeds `bytes`; appends the data of every event they complete to `events`. After an
    /// error the decoder is spent: the stream is broken.
    pub fn push(&mut self, bytes: &[u8], events: &mut Vec<String>) -> Result<(), EventTooLarge> {
        let mut bytes = bytes;
        if let Some(matched) = self.bom {
            let mut matched = matched;
            while let Some((&b, rest)) = bytes.split_first() {
                if b != BOM[matched] {
                    break;
                }
                matched += 1;
                bytes = rest;
                if matched == BOM.len() {
                    break;
                }
            }
            if matched == BOM.len() || !bytes.is_empty() {
                self.bom = None;
                // A partial mark that turned out to be text is text.
                if matched < BOM.len() {
                    self.line.extend_from_slice(&BOM[..matched]);
                }
            } else {
                self.bom = Some(matched);
                return Ok(());
            }
        }
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
            if self.line.len() + self.data.len() > self.max_event {
                return Err(EventTooLarge { limit: self.max_event });
            }
        }
        Ok(())
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
            decoder.push(piece, &mut events).expect("small events");
        }
        events
    }

    #[test]
    fn a_byte_order_mark_opening_the_stream_is_skipped_even_split() {
        let text = b"\xEF\xBB\xBFdata: first\n\ndata: second\n\n";
        assert_eq!(decode(&[text]), ["first", "second"]);
        assert_eq!(decode(&[&text[..1], &text[1..2], &text[2..]]), ["first", "second"]);
        // Only at the very start.
        assert_eq!(decode(&[b"data: a\xEF\xBB\xBF\n\n"]), ["a\u{feff}"]);
    }

    #[test]
    fn a_flood_without_a_line_end_is_an_error_not_a_growing_buffer() {
        let mut decoder = SseDecoder::with_limit(1024);
        let mut events = Vec::new();
        let flood = vec![b'x'; 600];
        assert!(decoder.push(&flood, &mut events).is_ok());
        assert_eq!(decoder.push(&flood, &mut events), Err(EventTooLarge { limit: 1024 }));
        assert!(decoder.line.capacity() < 4096, "buffered no more than the limit");
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
        decoder.push(b"data: {\"partial\":", &mut events).expect("small");
        assert!(events.is_empty());
    }

    #[test]
    fn a_crlf_split_between_pieces_is_one_line_end() {
        assert_eq!(decode(&[b"data: x\r", b"\n\r", b"\n"]), ["x"]);
    }

    fn splitting_never_changes_the_events(cuts: Vec<u16>) -> bool {
        let text: &[u8] = b"data: {\"a\":1}\r\n\r\n: ping\n\ndata: line1\ndata: line2\n\rdata: x\r\rdata: [DONE]\r\n\r\n";
        let whole = decode(&[text]);
        let mut points: Vec<usize> = cuts.iter().map(|c| *c as usize % (text.len() + 1)).collect();
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
