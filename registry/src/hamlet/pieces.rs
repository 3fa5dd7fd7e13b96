//! Request bodies of the Hamlet listener reach tonic in pieces of at most [`PIECE_BYTES`], and
//! [`hamlet_transport`] is that listener's tonic server, pieces and keepalive included.
//!
//! tonic decodes a request stream from one buffer per stream, which keeps the largest size it
//! ever grew to for the life of the stream. An HTTP/2 DATA frame can carry 16 KiB, and a tonic
//! client (xcc's importer, the bench's consumers) packs its ACKs into frames that large when it
//! acknowledges a burst, so each consumer's buffer grew to hold one and kept it while the stream
//! idled: about 20 MiB over 1,000 idle streams. Cut into pieces (a zero-copy split of the same
//! bytes) a frame never needs more than the buffer tonic first allocates (8 KiB).

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tonic::Status;

/// A request of the Hamlet listener, mapped by [`Pieces::request`].
type MapRequest = fn(http::Request<tonic::body::Body>) -> http::Request<tonic::body::Body>;

/// The tonic server a Hamlet listener runs on, before its services are added.
pub type HamletTransport = tonic::transport::Server<
    tower::layer::util::Stack<
        tower::util::MapRequestLayer<MapRequest>,
        tower::layer::util::Identity,
    >,
>;

/// The transport of the registry's Hamlet listener (and of the bench's transport floor, which
/// must be the same): request bodies in [`Pieces`], so no stream's decode buffer grows, and
/// HTTP/2 keepalive pings that hold idle streams open through middleboxes (hyper does not
/// police client pings, so Go peers' 20 s pings are accepted).
pub fn hamlet_transport() -> HamletTransport {
    tonic::transport::Server::builder()
        .layer(tower::util::MapRequestLayer::new(
            Pieces::request as MapRequest,
        ))
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
}

/// Largest piece of a request body handed to tonic: half its first allocation, so a piece and
/// the unfinished message before it fit.
pub const PIECE_BYTES: usize = 4 * 1024;

/// A request body whose data frames are at most [`PIECE_BYTES`] each, in order; other frames
/// (trailers) and errors pass as they come.
pub struct Pieces {
    inner: tonic::body::Body,
    /// The part of the last data frame not handed on yet.
    rest: Bytes,
}

impl Pieces {
    pub fn new(inner: tonic::body::Body) -> Self {
        Self {
            inner,
            rest: Bytes::new(),
        }
    }

    /// `request` with its body cut into pieces.
    pub fn request(request: http::Request<tonic::body::Body>) -> http::Request<tonic::body::Body> {
        request.map(|body| tonic::body::Body::new(Pieces::new(body)))
    }
}

impl Body for Pieces {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if this.rest.is_empty() {
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.rest = data,
                    Err(other) => return Poll::Ready(Some(Ok(other))),
                },
                end => return Poll::Ready(end),
            }
        }
        let piece = this.rest.split_to(this.rest.len().min(PIECE_BYTES));
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        hint.set_lower(hint.lower() + rest);
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper + rest);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    /// Every byte arrives, in order, in pieces of at most PIECE_BYTES; an empty frame is passed
    /// on as it came; the trailers follow the data.
    #[tokio::test]
    async fn frames_are_cut_into_pieces_and_nothing_is_lost() {
        let big: Vec<u8> = (0..(PIECE_BYTES * 3 + 100))
            .map(|i| (i % 251) as u8)
            .collect();
        let small = vec![7u8; 10];
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let frames: Vec<Result<Frame<Bytes>, Status>> = vec![
            Ok(Frame::data(Bytes::from(big.clone()))),
            Ok(Frame::data(Bytes::from(small.clone()))),
            Ok(Frame::trailers(trailers.clone())),
        ];
        let inner = tonic::body::Body::new(http_body_util::StreamBody::new(futures::stream::iter(
            frames,
        )));
        let mut body = Pieces::new(inner);
        let mut sizes = Vec::new();
        let mut bytes = Vec::new();
        let mut got_trailers = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.expect("the inner body yields no error");
            match frame.into_data() {
                Ok(data) => {
                    sizes.push(data.len());
                    bytes.extend_from_slice(&data);
                }
                Err(frame) => got_trailers = frame.into_trailers().ok(),
            }
        }
        assert_eq!(sizes, [PIECE_BYTES, PIECE_BYTES, PIECE_BYTES, 100, 10]);
        assert_eq!(bytes, [big, small].concat());
        assert_eq!(got_trailers, Some(trailers));
    }
}
