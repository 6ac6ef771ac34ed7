//! A minimal SPDY/3.1 client for tests (draft-mbelshe-httpbis-spdy-00, the SPDY/3.1 revision):
//! what `kubectl exec`/`attach`/`port-forward` speak by default after an HTTP/1.1 upgrade to
//! `SPDY/3.1`, over any byte stream (here the test's TLS connection after the 101).
//!
//! Frames (all integers big endian):
//! - control: `|1| version (15) | type (16) |`, `| flags (8) | length (24) |`, payload;
//! - data: `|0| stream id (31) |`, `| flags (8) | length (24) |`, payload (flag FIN = 0x01).
//!
//! Name/value header blocks (SYN_STREAM, SYN_REPLY, HEADERS) are one zlib stream per direction
//! for the whole connection, primed with the protocol's dictionary ([`DICTIONARY`]), each block
//! ending with a sync flush. A block is `count (32)` then per pair `name length (32)`, name
//! (lowercase), `value length (32)`, value (several values separated by NUL).
//!
//! Not implemented (the tests move a few bytes): flow control (WINDOW_UPDATE is tolerated,
//! never sent), priorities, server push. PING is answered; SETTINGS are ignored.

use std::collections::{HashMap, HashSet};
use std::io;
use std::time::Instant;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const VERSION: u16 = 3;
pub const FLAG_FIN: u8 = 0x01;

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const SETTINGS: u16 = 4;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;

/// Words of the SPDY/3 header compression dictionary, each preceded on the wire by its length
/// as a 32-bit integer (the dictionary mimics a header block).
const DICTIONARY_WORDS: &[&str] = &[
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

/// The rest of the dictionary, raw.
const DICTIONARY_TAIL: &str = concat!(
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
    "203 Non-Authoritative Information",
    "204 No Content",
    "301 Moved Permanently",
    "400 Bad Request",
    "401 Unauthorized",
    "403 Forbidden",
    "404 Not Found",
    "500 Internal Server Error",
    "501 Not Implemented",
    "503 Service Unavailable",
    "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT",
    "chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,",
    "text/plain,text/javascript,publicprivatemax-age=gzip,deflate,sdch",
    "charset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
);

/// The SPDY/3 header compression dictionary.
pub fn dictionary() -> Vec<u8> {
    let mut dict = Vec::new();
    for word in DICTIONARY_WORDS {
        dict.extend_from_slice(&(word.len() as u32).to_be_bytes());
        dict.extend_from_slice(word.as_bytes());
    }
    dict.extend_from_slice(DICTIONARY_TAIL.as_bytes());
    dict
}

/// One received frame, header blocks decoded. PING is answered inside [`Spdy::next_frame`].
#[derive(Debug)]
pub enum Frame {
    SynStream {
        stream: u32,
        headers: Vec<(String, String)>,
    },
    SynReply {
        stream: u32,
        fin: bool,
        headers: Vec<(String, String)>,
    },
    Headers {
        stream: u32,
        headers: Vec<(String, String)>,
    },
    Data {
        stream: u32,
        fin: bool,
        data: Vec<u8>,
    },
    RstStream {
        stream: u32,
        status: u32,
    },
    GoAway {
        last_good_stream: u32,
        status: u32,
    },
    /// SETTINGS, WINDOW_UPDATE, or a type this client does not know: tolerated.
    Ignored {
        kind: u16,
    },
}

/// A SPDY/3.1 client session over `io`.
pub struct Spdy<S> {
    io: S,
    deflate: Compress,
    inflate: Decompress,
    next_stream: u32,
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

impl<S: AsyncRead + AsyncWrite + Unpin> Spdy<S> {
    pub fn new(io: S) -> Spdy<S> {
        let mut deflate = Compress::new(Compression::default(), true);
        deflate.set_dictionary(&dictionary()).expect("zlib dictionary");
        // Client-initiated streams have odd ids.
        Spdy { io, deflate, inflate: Decompress::new(true), next_stream: 1 }
    }

    /// Opens a stream with `headers` (names are lowercased) and returns its id.
    pub async fn open_stream(&mut self, headers: &[(&str, &str)], fin: bool) -> io::Result<u32> {
        let stream = self.next_stream;
        self.next_stream += 2;
        let mut payload = Vec::new();
        payload.extend_from_slice(&stream.to_be_bytes());
        payload.extend_from_slice(&0u32.to_be_bytes()); // associated-to stream id
        payload.push(0); // priority (3 bits) and unused
        payload.push(0); // slot
        payload.extend_from_slice(&self.header_block(headers)?);
        self.send_control(SYN_STREAM, if fin { FLAG_FIN } else { 0 }, &payload).await?;
        Ok(stream)
    }

    /// Sends `data` on `stream`; `fin` half-closes the stream (our side).
    pub async fn send_data(&mut self, stream: u32, data: &[u8], fin: bool) -> io::Result<()> {
        assert!(data.len() < 1 << 24, "data frame too long");
        let mut frame = Vec::with_capacity(8 + data.len());
        frame.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
        let flags = if fin { FLAG_FIN } else { 0 };
        frame.extend_from_slice(&((u32::from(flags) << 24) | data.len() as u32).to_be_bytes());
        frame.extend_from_slice(data);
        self.io.write_all(&frame).await?;
        self.io.flush().await
    }

    /// Resets `stream` (status 5 = CANCEL).
    pub async fn reset(&mut self, stream: u32, status: u32) -> io::Result<()> {
        let mut payload = stream.to_be_bytes().to_vec();
        payload.extend_from_slice(&status.to_be_bytes());
        self.send_control(RST_STREAM, 0, &payload).await
    }

    /// The next frame from the server; `Ok(None)` once the connection is closed. PINGs are
    /// echoed back and not returned.
    pub async fn next_frame(&mut self) -> io::Result<Option<Frame>> {
        loop {
            let mut head = [0u8; 8];
            match self.io.read_exact(&mut head).await {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
                Err(e) => return Err(e),
            }
            let flags = head[4];
            let len = (be32(&head[4..8]) & 0x00ff_ffff) as usize;
            let mut payload = vec![0u8; len];
            self.io.read_exact(&mut payload).await?;
            if head[0] & 0x80 == 0 {
                let stream = be32(&head[0..4]) & 0x7fff_ffff;
                return Ok(Some(Frame::Data { stream, fin: flags & FLAG_FIN != 0, data: payload }));
            }
            let version = u16::from_be_bytes([head[0], head[1]]) & 0x7fff;
            let kind = u16::from_be_bytes([head[2], head[3]]);
            if version != VERSION {
                return Err(invalid(format!("control frame of SPDY version {version}")));
            }
            let need = |n: usize| {
                if payload.len() < n { Err(invalid(format!("control frame {kind} too short: {len}"))) } else { Ok(()) }
            };
            let frame = match kind {
                SYN_STREAM => {
                    need(10)?;
                    let headers = self.parse_header_block(&payload[10..])?;
                    Frame::SynStream { stream: be32(&payload) & 0x7fff_ffff, headers }
                }
                SYN_REPLY | HEADERS => {
                    need(4)?;
                    let stream = be32(&payload) & 0x7fff_ffff;
                    let headers = self.parse_header_block(&payload[4..])?;
                    if kind == SYN_REPLY {
                        Frame::SynReply { stream, fin: flags & FLAG_FIN != 0, headers }
                    } else {
                        Frame::Headers { stream, headers }
                    }
                }
                RST_STREAM => {
                    need(8)?;
                    Frame::RstStream { stream: be32(&payload) & 0x7fff_ffff, status: be32(&payload[4..]) }
                }
                PING => {
                    need(4)?;
                    self.send_control(PING, 0, &payload[..4]).await?;
                    continue;
                }
                GOAWAY => {
                    need(8)?;
                    Frame::GoAway { last_good_stream: be32(&payload) & 0x7fff_ffff, status: be32(&payload[4..]) }
                }
                SETTINGS | WINDOW_UPDATE => Frame::Ignored { kind },
                _ => Frame::Ignored { kind },
            };
            return Ok(Some(frame));
        }
    }

    async fn send_control(&mut self, kind: u16, flags: u8, payload: &[u8]) -> io::Result<()> {
        assert!(payload.len() < 1 << 24, "control frame too long");
        let mut frame = Vec::with_capacity(8 + payload.len());
        frame.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
        frame.extend_from_slice(&kind.to_be_bytes());
        frame.extend_from_slice(&((u32::from(flags) << 24) | payload.len() as u32).to_be_bytes());
        frame.extend_from_slice(payload);
        self.io.write_all(&frame).await?;
        self.io.flush().await
    }

    /// Encodes and compresses a header block (continuing this direction's zlib stream).
    fn header_block(&mut self, headers: &[(&str, &str)]) -> io::Result<Vec<u8>> {
        let mut raw = Vec::new();
        raw.extend_from_slice(&(headers.len() as u32).to_be_bytes());
        for (name, value) in headers {
            let name = name.to_ascii_lowercase();
            raw.extend_from_slice(&(name.len() as u32).to_be_bytes());
            raw.extend_from_slice(name.as_bytes());
            raw.extend_from_slice(&(value.len() as u32).to_be_bytes());
            raw.extend_from_slice(value.as_bytes());
        }
        let mut out = Vec::with_capacity(raw.len() + 64);
        let mut consumed = 0;
        loop {
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(&raw[consumed..], &mut out, FlushCompress::Sync)
                .map_err(|e| invalid(format!("deflate: {e}")))?;
            consumed += (self.deflate.total_in() - before) as usize;
            // Done once all input is in and the flush fitted (output space left over).
            if consumed == raw.len() && out.len() < out.capacity() {
                return Ok(out);
            }
            out.reserve(out.capacity().max(64));
        }
    }

    /// Decompresses and decodes a header block (continuing the server's zlib stream).
    fn parse_header_block(&mut self, compressed: &[u8]) -> io::Result<Vec<(String, String)>> {
        let mut raw = Vec::with_capacity(compressed.len() * 4 + 256);
        let mut consumed = 0;
        loop {
            let before = self.inflate.total_in();
            let result = self.inflate.decompress_vec(&compressed[consumed..], &mut raw, FlushDecompress::Sync);
            consumed += (self.inflate.total_in() - before) as usize;
            match result {
                Ok(_) => {}
                Err(e) => match e.needs_dictionary() {
                    Some(_) => {
                        self.inflate.set_dictionary(&dictionary()).map_err(|e| invalid(format!("dictionary: {e}")))?;
                        continue;
                    }
                    None => return Err(invalid(format!("inflate: {e}"))),
                },
            }
            if consumed == compressed.len() && raw.len() < raw.capacity() {
                break;
            }
            raw.reserve(raw.capacity().max(256));
        }
        let mut headers = Vec::new();
        let rest = &mut &raw[..];
        let count = be32(take(rest, 4)?);
        for _ in 0..count {
            let len = be32(take(rest, 4)?) as usize;
            let name = String::from_utf8_lossy(take(rest, len)?).into_owned();
            let len = be32(take(rest, 4)?) as usize;
            let value = String::from_utf8_lossy(take(rest, len)?).into_owned();
            headers.push((name, value));
        }
        Ok(headers)
    }
}

/// The first `n` bytes of `rest`, advancing it.
fn take<'a>(rest: &mut &'a [u8], n: usize) -> io::Result<&'a [u8]> {
    if rest.len() < n {
        return Err(invalid("truncated header block"));
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

/// What arrived so far on a session's streams.
#[derive(Default)]
pub struct Streams {
    pub replied: HashSet<u32>,
    pub data: HashMap<u32, Vec<u8>>,
    /// Streams the server half-closed (FIN on a data frame or SYN_REPLY).
    pub finished: HashSet<u32>,
    pub reset: HashMap<u32, u32>,
    pub goaway: bool,
    /// The connection closed.
    pub closed: bool,
}

impl Streams {
    pub fn text(&self, stream: u32) -> String {
        String::from_utf8_lossy(self.data.get(&stream).map_or(&[][..], |d| d)).into_owned()
    }

    /// The server is done with `stream`: it half-closed it (FIN) or reset it.
    pub fn ended(&self, stream: u32) -> bool {
        self.finished.contains(&stream) || self.reset.contains_key(&stream)
    }
}

impl std::fmt::Debug for Streams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut data: Vec<_> = self.data.keys().map(|id| (*id, self.text(*id))).collect();
        data.sort();
        let sorted = |set: &HashSet<u32>| {
            let mut v: Vec<_> = set.iter().copied().collect();
            v.sort();
            v
        };
        let mut reset: Vec<_> = self.reset.iter().collect();
        reset.sort();
        f.debug_struct("Streams")
            .field("replied", &sorted(&self.replied))
            .field("data", &data)
            .field("finished", &sorted(&self.finished))
            .field("reset", &reset)
            .field("goaway", &self.goaway)
            .field("closed", &self.closed)
            .finish()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Spdy<S> {
    /// Reads frames into `streams` until `done` holds or the connection closes; panics at
    /// `deadline`.
    pub async fn read_until(&mut self, streams: &mut Streams, deadline: Instant, done: impl Fn(&Streams) -> bool) {
        while !done(streams) && !streams.closed {
            let left = deadline.saturating_duration_since(Instant::now());
            let frame = match tokio::time::timeout(left, self.next_frame()).await {
                Ok(Ok(Some(frame))) => frame,
                Ok(Ok(None)) => {
                    streams.closed = true;
                    break;
                }
                // TLS without close_notify and the like: the connection is gone.
                Ok(Err(e)) if e.kind() != io::ErrorKind::InvalidData => {
                    streams.closed = true;
                    break;
                }
                Ok(Err(e)) => panic!("SPDY protocol error: {e}; so far: {streams:?}"),
                Err(_) => panic!("timed out reading SPDY frames; so far: {streams:?}"),
            };
            match frame {
                Frame::SynReply { stream, fin, .. } => {
                    streams.replied.insert(stream);
                    if fin {
                        streams.finished.insert(stream);
                    }
                }
                Frame::Data { stream, fin, data } => {
                    streams.data.entry(stream).or_default().extend_from_slice(&data);
                    if fin {
                        streams.finished.insert(stream);
                    }
                }
                Frame::RstStream { stream, status } => {
                    streams.reset.insert(stream, status);
                }
                Frame::GoAway { .. } => streams.goaway = true,
                Frame::SynStream { .. } | Frame::Headers { .. } | Frame::Ignored { .. } => {}
            }
        }
    }
}
