//! The gRPC codec of every xcc service: prost's, with tonic's encode buffer kept from growing.
//!
//! tonic encodes a response stream into one buffer and hands HTTP/2 a chunk of it whenever the
//! stream pauses or [`YIELD_BYTES`] are waiting. The buffer keeps the size it grew to for as
//! long as the stream lives, so a stream that sent one large burst (a snapshot) would hold that
//! much while it idles, and a registry holds a thousand idle Hamlet streams. Chunks of at most
//! [`YIELD_BYTES`] (half the buffer) fit the buffer as first allocated: a burst however long
//! leaves in chunks of that size, and the buffer stays at [`BUFFER_BYTES`].
//!
//! Measured (docs/benchmarks.md, issue 28, session 17): 1,000 idle Hamlet streams held 122 MiB
//! with this codec against 143–145 MiB with tonic's 32 KiB yield, although the Hamlet server
//! already ended its bursts at 4 KiB; where the other 20 MiB went was not traced.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// tonic's first allocation for a stream's encode and decode buffers (its default).
pub const BUFFER_BYTES: usize = 8 * 1024;
/// Encoded bytes after which tonic hands a chunk to HTTP/2 (tonic's default: 32 KiB).
pub const YIELD_BYTES: usize = 4 * 1024;

/// prost encoding with [`BUFFER_BYTES`] and [`YIELD_BYTES`].
#[derive(Debug, Clone)]
pub struct XccCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for XccCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for XccCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::new(BUFFER_BYTES, YIELD_BYTES))
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(BufferSettings::new(BUFFER_BYTES, YIELD_BYTES))
    }
}

// A chunk is at most the yield plus one message: half the buffer leaves room for that message
// in the buffer as first allocated (messages larger than the other half make it grow, as any
// large message would).
const _: () = assert!(YIELD_BYTES * 2 <= BUFFER_BYTES);
