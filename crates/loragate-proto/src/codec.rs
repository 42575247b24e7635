//! The codec of the generated services and clients: prost's, except that a message that cannot be decoded is
//! `INVALID_ARGUMENT` (the peer sent bytes that are not the message) instead of prost's `INTERNAL`, which would
//! blame the server for a caller's bad input.

use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// [`ProstCodec`] with undecodable messages reported as `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct LoragateCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Default for LoragateCodec<T, U> {
    fn default() -> Self {
        Self(ProstCodec::default())
    }
}

impl<T, U> Codec for LoragateCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = LoragateDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        LoragateDecoder(self.0.decoder())
    }
}

/// [`ProstDecoder`] with undecodable messages reported as `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct LoragateDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for LoragateDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| match status.code() {
            Code::Internal => {
                Status::invalid_argument(format!("the message is not valid protobuf: {}", status.message()))
            }
            _ => status,
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
