//! The wire side of a table: its declaration and its codec, with the row type erased.

use crate::codec::{CodecError, ErasedCodec};
use crate::row::{Row, Table};
use crate::value::Value;
use std::fmt;
use std::sync::Arc;

/// What a host knows of a sender, set on each row it uploads to one table
/// before the row is filed: given the sender (as the transport
/// authenticated it) and the row as column name → JSON value, it sets or
/// checks columns; an error refuses the row, with the error as the reason.
/// The origin column is set to the sender after it, whatever it did.
pub type Stamp = Arc<
    dyn Fn(&str, &mut serde_json::Map<String, serde_json::Value>) -> Result<(), String>
        + Send
        + Sync,
>;

/// One table as the engine holds it: what it declares and how its rows travel.
#[derive(Clone)]
pub struct Codec {
    table: &'static Table,
    inner: Arc<dyn ErasedCodec>,
    stamp: Option<Stamp>,
}

impl fmt::Debug for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("wire::Codec")
            .field("table", &self.table.name)
            .field("format", &self.inner.format())
            .field("stamped", &self.stamp.is_some())
            .finish()
    }
}

impl Codec {
    /// The table `R` declares, with the codec it declares.
    pub fn of<R: Row>() -> Self {
        Codec {
            table: &R::TABLE,
            inner: Arc::new(R::codec()),
            stamp: None,
        }
    }

    /// The table `R` declares, travelling in `codec` instead of the one
    /// it declares.
    pub fn with<R: Row>(codec: crate::codec::Codec<R>) -> Self {
        Codec {
            table: &R::TABLE,
            inner: Arc::new(codec),
            stamp: None,
        }
    }

    /// The host's stamp on rows uploaded to this table, if it has one.
    pub fn stamp(&self) -> Option<&Stamp> {
        self.stamp.as_ref()
    }

    #[doc(hidden)]
    pub fn set_stamp(&mut self, stamp: Stamp) {
        self.stamp = Some(stamp);
    }

    /// The declaration.
    pub fn table(&self) -> &'static Table {
        self.table
    }

    /// The table's name.
    pub fn name(&self) -> &'static str {
        self.table.name
    }

    /// `json` or `protobuf`.
    pub fn format(&self) -> &'static str {
        self.inner.format()
    }

    /// Encodes a row given as its column values, in declared column order.
    pub fn encode(&self, values: Vec<Value>) -> Result<Vec<u8>, CodecError> {
        self.inner.encode_values(values)
    }

    /// Decodes a row into its column values, in declared column order.
    pub fn decode(&self, bytes: &[u8]) -> Result<Vec<Value>, CodecError> {
        self.inner.decode_values(bytes)
    }
}
