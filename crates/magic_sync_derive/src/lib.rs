//! `#[derive(Row)]` and `#[derive(Columns)]` for magic_sync.
//!
//! The derives read `#[row(...)]` attributes, check the declaration as a whole
//! (direction, rule, key, per-field roles) and write impls that name the
//! runtime crate by absolute paths (`::magic_sync::...`).

use proc_macro::TokenStream;
use syn::{parse_macro_input, DeriveInput};

mod attrs;
mod check;
mod columns;
mod errors;
mod row;
mod shape;

/// Declares a table: implements `magic_sync::row::Columns` and `magic_sync::row::Row`.
#[proc_macro_derive(Row, attributes(row))]
pub fn derive_row(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    row::expand(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// Implements `magic_sync::row::Columns` for a struct whose fields are columns.
#[proc_macro_derive(Columns, attributes(row))]
pub fn derive_columns(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    columns::expand(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}
