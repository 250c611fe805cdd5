//! The registration socket, served so that kubelet's plugin watcher can
//! call it.
//!
//! kubelet dials a plugin's registration socket by its bare path without
//! an authority override (`pluginmanager/operationexecutor`, unlike its
//! device-plugin and DRA clients, which send `localhost`), so grpc-go sends
//! the percent-encoded socket path as the HTTP/2 `:authority`. The HTTP/2
//! server under tonic refuses that value (not a host name) and resets the
//! stream: kubelet logged "failed to get plugin info using RPC GetInfo ...
//! RST_STREAM with error code: PROTOCOL_ERROR" on the project's cluster
//! and never registered the driver.
//!
//! So each accepted connection is relayed through an in-memory pipe that
//! tonic serves, and in the client's bytes the `:authority` of every
//! HEADERS frame is replaced by `localhost` ([`Rewriter`]). Only the HPACK
//! structure is walked (RFC 7541: integers and string lengths), never a
//! value decoded; a header block this cannot walk is passed on unchanged.
//! The decoder's dynamic table then holds `localhost` where the client's
//! holds the path, at the same position, so later references to the entry
//! resolve to `localhost` too.

use std::io;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream};
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

/// The authority the server is given.
pub const AUTHORITY: &[u8] = b"localhost";
/// The client connection preface (RFC 9113, 3.4).
const PREFACE_LEN: usize = 24;
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// HPACK's static index of `:authority`.
const STATIC_AUTHORITY: u64 = 1;
/// Buffer of each in-memory pipe.
const PIPE: usize = 64 * 1024;

/// The client-to-server byte stream of one connection, with each HEADERS
/// frame's `:authority` replaced.
#[derive(Debug)]
pub struct Rewriter {
    preface_left: usize,
    pending: Vec<u8>,
}

impl Default for Rewriter {
    fn default() -> Self {
        Self {
            preface_left: PREFACE_LEN,
            pending: Vec::new(),
        }
    }
}

impl Rewriter {
    /// Takes `input` and appends to `out` every whole frame it completes.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        self.pending.extend_from_slice(input);
        let mut at = 0;
        if self.preface_left > 0 {
            let n = self.preface_left.min(self.pending.len());
            out.extend_from_slice(&self.pending[..n]);
            self.preface_left -= n;
            at = n;
        }
        while self.pending.len() - at >= FRAME_HEADER {
            let h = &self.pending[at..];
            let len = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
            if h.len() < FRAME_HEADER + len {
                break;
            }
            let frame = &h[..FRAME_HEADER + len];
            match (frame[3] == HEADERS)
                .then(|| headers_frame(frame))
                .flatten()
            {
                Some(rewritten) => out.extend_from_slice(&rewritten),
                None => out.extend_from_slice(frame),
            }
            at += FRAME_HEADER + len;
        }
        self.pending.drain(..at);
    }
}

/// A HEADERS frame with its `:authority` replaced (padding dropped), or
/// `None` to pass it on as it is.
fn headers_frame(frame: &[u8]) -> Option<Vec<u8>> {
    let flags = frame[4];
    if flags & END_HEADERS == 0 {
        // The block goes on in CONTINUATION frames: not walked.
        return None;
    }
    let payload = &frame[FRAME_HEADER..];
    let (mut start, mut end) = (0, payload.len());
    if flags & PADDED != 0 {
        let pad = usize::from(*payload.first()?);
        start = 1;
        end = end.checked_sub(pad)?;
    }
    let priority = if flags & PRIORITY != 0 { 5 } else { 0 };
    let block = payload.get(start + priority..end)?;
    let prefix = payload.get(start..start + priority)?;
    let new_block = header_block(block)?;
    let len = prefix.len() + new_block.len();
    if len >= 1 << 24 {
        return None;
    }
    let mut out = Vec::with_capacity(FRAME_HEADER + len);
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8]);
    out.push(HEADERS);
    out.push(flags & !PADDED);
    out.extend_from_slice(&frame[5..FRAME_HEADER]);
    out.extend_from_slice(prefix);
    out.extend_from_slice(&new_block);
    Some(out)
}

/// An HPACK integer with an `n`-bit prefix at `b[0]`: (value, bytes used).
fn integer(b: &[u8], n: u32) -> Option<(u64, usize)> {
    let mask = (1u16 << n) as u8 - 1;
    let first = b.first()? & mask;
    if first < mask {
        return Some((u64::from(first), 1));
    }
    let mut value = u64::from(mask);
    let mut shift = 0;
    for (i, byte) in b.iter().enumerate().skip(1) {
        if shift > 56 {
            return None;
        }
        value += u64::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// Length in bytes of the HPACK string literal at `b[0]`, and whether it
/// is Huffman-coded; `None` if it runs past `b`.
fn string(b: &[u8]) -> Option<(usize, bool, usize)> {
    let (len, used) = integer(b, 7)?;
    let len = usize::try_from(len).ok()?;
    (b.len() >= used + len).then(|| (used, b[0] & 0x80 != 0, len))
}

/// The header block with every `:authority` field's value replaced.
fn header_block(block: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(block.len());
    let mut i = 0;
    while i < block.len() {
        let b = block[i];
        let rest = &block[i..];
        if b & 0x80 != 0 {
            // Indexed field.
            let (_, n) = integer(rest, 7)?;
            out.extend_from_slice(&rest[..n]);
            i += n;
            continue;
        }
        if b & 0xe0 == 0x20 {
            // Dynamic table size update.
            let (_, n) = integer(rest, 5)?;
            out.extend_from_slice(&rest[..n]);
            i += n;
            continue;
        }
        // A literal: with incremental indexing (6-bit prefix), without
        // indexing or never indexed (4-bit prefix).
        let prefix = if b & 0xc0 == 0x40 { 6 } else { 4 };
        let (index, n) = integer(rest, prefix)?;
        let mut j = n;
        let authority = if index == 0 {
            let (used, huffman, len) = string(&rest[j..])?;
            let name = &rest[j + used..j + used + len];
            j += used + len;
            !huffman && name == b":authority"
        } else {
            index == STATIC_AUTHORITY
        };
        let (used, _, len) = string(&rest[j..])?;
        let end = j + used + len;
        if authority {
            out.extend_from_slice(&rest[..j]);
            out.push(AUTHORITY.len() as u8);
            out.extend_from_slice(AUTHORITY);
        } else {
            out.extend_from_slice(&rest[..end]);
        }
        i += end;
    }
    Some(out)
}

/// Relays one client connection into `server`, rewriting its requests.
async fn relay(client: tokio::net::UnixStream, server: DuplexStream) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = tokio::io::split(server);
    let up = async move {
        let mut rewriter = Rewriter::default();
        let mut buf = vec![0u8; 16 * 1024];
        let mut out = Vec::new();
        loop {
            let n = client_read.read(&mut buf).await?;
            if n == 0 {
                server_write.shutdown().await?;
                return Ok::<(), io::Error>(());
            }
            out.clear();
            rewriter.feed(&buf[..n], &mut out);
            server_write.write_all(&out).await?;
        }
    };
    let down = async move {
        tokio::io::copy(&mut server_read, &mut client_write).await?;
        client_write.shutdown().await
    };
    let _ = tokio::join!(up, down);
}

/// Connections accepted on `listener`, each as the server's end of a
/// relay; the task accepts until aborted.
pub fn incoming(
    listener: UnixListener,
) -> (ReceiverStream<io::Result<DuplexStream>>, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(8);
    let task = tokio::spawn(async move {
        loop {
            let accepted = listener.accept().await;
            let item = accepted.map(|(client, _)| {
                let (ours, theirs) = tokio::io::duplex(PIPE);
                tokio::spawn(relay(client, ours));
                theirs
            });
            if tx.send(item).await.is_err() {
                return;
            }
        }
    });
    (ReceiverStream::new(rx), task)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// What grpc-go sends first: :method POST (indexed 3), :scheme http
    /// (indexed 6), :path as a literal with indexing (static name 4),
    /// :authority with indexing (static name 1), a literal new name.
    fn block(authority: &[u8]) -> Vec<u8> {
        let mut b = vec![0x83, 0x86, 0x44, 5];
        b.extend_from_slice(b"/a/Bb");
        b.push(0x41);
        b.push(authority.len() as u8);
        b.extend_from_slice(authority);
        b.extend_from_slice(&[0x00, 2]);
        b.extend_from_slice(b"te");
        b.push(8);
        b.extend_from_slice(b"trailers");
        b
    }

    #[test]
    fn the_authority_of_a_headers_frame_becomes_localhost_and_the_rest_passes() {
        let path = b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.tessera.dev-reg.sock";
        let mut input = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        let settings = frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]);
        input.extend_from_slice(&settings);
        input.extend_from_slice(&frame(HEADERS, END_HEADERS, 1, &block(path)));
        let data = frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0]);
        input.extend_from_slice(&data);
        // Fed in pieces, as a socket delivers it.
        let mut r = Rewriter::default();
        let mut out = Vec::new();
        for piece in input.chunks(7) {
            r.feed(piece, &mut out);
        }
        let mut want = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        want.extend_from_slice(&settings);
        want.extend_from_slice(&frame(HEADERS, END_HEADERS, 1, &block(b"localhost")));
        want.extend_from_slice(&data);
        assert_eq!(out, want);
    }

    #[test]
    fn padding_is_dropped_priority_kept_and_long_lengths_read() {
        let long = vec![b'x'; 300];
        let mut payload = vec![3];
        payload.extend_from_slice(&[0, 0, 0, 0, 16]);
        let mut b = vec![0x82, 0x41, 0x7f];
        // 300 = 127 + 173: 173 = 0xad, last byte.
        b.push(0xad);
        b.push(0x01);
        b.extend_from_slice(&long);
        payload.extend_from_slice(&b);
        payload.extend_from_slice(&[0, 0, 0]);
        let got = headers_frame(&frame(
            HEADERS,
            END_HEADERS | PADDED | PRIORITY,
            3,
            &payload,
        ))
        .unwrap();
        let mut want_payload = vec![0, 0, 0, 0, 16, 0x82, 0x41, 9];
        want_payload.extend_from_slice(b"localhost");
        assert_eq!(
            got,
            frame(HEADERS, END_HEADERS | PRIORITY, 3, &want_payload)
        );
    }

    #[test]
    fn a_block_that_cannot_be_walked_passes_unchanged() {
        // A string running past the block, and a block continued elsewhere.
        let cut = frame(HEADERS, END_HEADERS, 1, &[0x41, 20, b'a']);
        let continued = frame(HEADERS, 0, 1, &block(b"%2Fx"));
        let mut r = Rewriter::default();
        let mut out = Vec::new();
        let mut input = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        input.extend_from_slice(&cut);
        input.extend_from_slice(&continued);
        r.feed(&input, &mut out);
        assert_eq!(out, input);
    }
}
