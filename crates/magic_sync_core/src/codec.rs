//! How a table's rows are encoded on the wire.
//!
//! A [`Codec<R>`] knows one row type. JSON ([`Codec::json`]) writes an object of
//! the row's columns; protobuf ([`Codec::protobuf`] or [`Codec::new`]) writes a
//! message of the table's own through a mapping each way.

use crate::columns::Columns;
use crate::value::{Value, ValueError};
use std::fmt;
use std::marker::PhantomData;

/// Why a row did not encode or decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// A value did not fit its field.
    #[error("{0}")]
    Value(#[from] ValueError),
    /// The bytes are not a message of this codec.
    #[error("malformed {format}: {reason}")]
    Malformed {
        /// `json` or `protobuf`.
        format: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// The row's own mapping refused it.
    #[error("the mapping refused the row: {0}")]
    Mapping(String),
}

/// A mapping between a row and a protobuf message of its own.
pub trait ProtoMapping<M>: Sized {
    /// The row as the message.
    fn to_proto(&self) -> M;
    /// The row from the message; an error says why it cannot be a row.
    fn from_proto(message: M) -> Result<Self, String>;
}

type Decode<R> = fn(&[u8]) -> Result<R, CodecError>;
type EncodeBox<R> = Box<dyn Fn(&R) -> Result<Vec<u8>, CodecError> + Send + Sync>;
type DecodeBox<R> = Box<dyn Fn(&[u8]) -> Result<R, CodecError> + Send + Sync>;

/// The encoding of one row type.
pub struct Codec<R> {
    format: &'static str,
    encode: EncodeBox<R>,
    decode: DecodeBox<R>,
    _row: PhantomData<fn() -> R>,
}

impl<R> fmt::Debug for Codec<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Codec")
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

/// `values` as the JSON codec writes a row: an object of the columns,
/// their keys in `order` (by name, as `serde_json` orders an object's),
/// `name` giving column `i`'s. Written straight, with nothing built on the
/// way. A replica that reads its tables from the server's description
/// writes its rows with it too.
pub fn json_object<'n>(
    order: &[usize],
    name: impl Fn(usize) -> &'n str,
    values: &[Value],
) -> Result<Vec<u8>, CodecError> {
    let malformed = |e: serde_json::Error| CodecError::Malformed {
        format: "json",
        reason: e.to_string(),
    };
    let mut out = Vec::with_capacity(16 + 24 * values.len());
    out.push(b'{');
    for (n, &i) in order.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, name(i)).map_err(malformed)?;
        out.push(b':');
        values[i].write_json(&mut out).map_err(malformed)?;
    }
    out.push(b'}');
    Ok(out)
}

impl<R: Columns> Codec<R> {
    /// An object of the row's columns, by column name.
    pub fn json() -> Self {
        // The columns as `serde_json`'s object orders them: by name. Written
        // straight, the bytes are the object's, with nothing built on the way.
        let mut order: Vec<usize> = (0..R::COLUMNS.len()).collect();
        order.sort_by_key(|&i| R::COLUMNS[i].name);
        let encode = move |row: &R| json_object(&order, |i| R::COLUMNS[i].name, &row.to_values());
        let decode: Decode<R> = |bytes| {
            let malformed = |reason: String| CodecError::Malformed {
                format: "json",
                reason,
            };
            let object: serde_json::Map<String, serde_json::Value> =
                serde_json::from_slice(bytes).map_err(|e| malformed(e.to_string()))?;
            let mut object = object;
            let mut values = Vec::with_capacity(R::COLUMNS.len());
            for column in R::COLUMNS {
                let json = object
                    .remove(column.name)
                    .unwrap_or(serde_json::Value::Null);
                values.push(
                    Value::from_json(column.kind, json).map_err(|e| e.in_column(column.name))?,
                );
            }
            Ok(R::from_values(values)?)
        };
        Codec {
            format: "json",
            encode: Box::new(encode),
            decode: Box::new(decode),
            _row: PhantomData,
        }
    }

    /// A protobuf message of the row's own, through `to` and `from`.
    pub fn new<M>(to: fn(&R) -> M, from: fn(M) -> Result<R, String>) -> Self
    where
        M: prost::Message + Default + 'static,
    {
        Codec {
            format: "protobuf",
            encode: Box::new(move |row| Ok(to(row).encode_to_vec())),
            decode: Box::new(move |bytes| {
                let message = M::decode(bytes).map_err(|e| CodecError::Malformed {
                    format: "protobuf",
                    reason: e.to_string(),
                })?;
                from(message).map_err(CodecError::Mapping)
            }),
            _row: PhantomData,
        }
    }

    /// A protobuf message of the row's own, through its [`ProtoMapping`].
    pub fn protobuf<M>() -> Self
    where
        M: prost::Message + Default + 'static,
        R: ProtoMapping<M>,
    {
        Codec::new(R::to_proto, R::from_proto)
    }

    /// A codec of the host's own, named `format`, converting a row each way
    /// with `encode` and `decode`. An error from `encode` is a row the
    /// server cannot send: it is set aside (in quarantine, with the error
    /// as its reason) until it changes or a build with a fixed codec
    /// starts, and nothing that points at it is sent meanwhile.
    pub fn custom(
        format: &'static str,
        encode: impl Fn(&R) -> Result<Vec<u8>, CodecError> + Send + Sync + 'static,
        decode: impl Fn(&[u8]) -> Result<R, CodecError> + Send + Sync + 'static,
    ) -> Self {
        Codec {
            format,
            encode: Box::new(encode),
            decode: Box::new(decode),
            _row: PhantomData,
        }
    }

    /// `json` or `protobuf`.
    pub fn format(&self) -> &'static str {
        self.format
    }

    /// Encodes a row.
    pub fn encode(&self, row: &R) -> Result<Vec<u8>, CodecError> {
        (self.encode)(row)
    }

    /// Decodes a row.
    pub fn decode(&self, bytes: &[u8]) -> Result<R, CodecError> {
        (self.decode)(bytes)
    }
}

/// A table's codec with the row type erased, so the engine holds every table
/// in one list and dispatches on the table's name.
#[doc(hidden)]
pub trait ErasedCodec: Send + Sync {
    fn encode_values(&self, values: Vec<Value>) -> Result<Vec<u8>, CodecError>;
    fn decode_values(&self, bytes: &[u8]) -> Result<Vec<Value>, CodecError>;
    fn format(&self) -> &'static str;
}

impl<R: Columns> ErasedCodec for Codec<R> {
    fn encode_values(&self, values: Vec<Value>) -> Result<Vec<u8>, CodecError> {
        let row = R::from_values(values)?;
        self.encode(&row)
    }
    fn decode_values(&self, bytes: &[u8]) -> Result<Vec<Value>, CodecError> {
        Ok(self.decode(bytes)?.to_values())
    }
    fn format(&self) -> &'static str {
        self.format
    }
}
