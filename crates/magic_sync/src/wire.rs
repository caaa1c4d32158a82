//! The wire side of a table: its declaration and its codec, with the row type erased.

use crate::codec::{CodecError, ErasedCodec};
use crate::row::{Row, Table};
use crate::value::Value;
use std::fmt;
use std::sync::Arc;

/// One table as the engine holds it: what it declares and how its rows travel.
#[derive(Clone)]
pub struct Codec {
    table: &'static Table,
    inner: Arc<dyn ErasedCodec>,
}

impl fmt::Debug for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("wire::Codec")
            .field("table", &self.table.name)
            .field("format", &self.inner.format())
            .finish()
    }
}

impl Codec {
    /// The table `R` declares, with the codec it declares.
    pub fn of<R: Row>() -> Self {
        Codec {
            table: &R::TABLE,
            inner: Arc::new(R::codec()),
        }
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
