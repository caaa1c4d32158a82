//! The `Columns` impl: column list, struct → values, values → struct.

use crate::attrs::is_row;
use crate::shape::{named_fields, ColumnField};
use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{DeriveInput, Error, Ident, Result};

/// `#[derive(Columns)]`: the impl, for a struct without `#[row(...)]` attributes.
pub fn expand(input: &DeriveInput) -> Result<TokenStream> {
    if let Some(attr) = input.attrs.iter().find(|a| is_row(a)) {
        let message = format!(
            "#[derive(Columns)] takes no `#[row(...)]` attributes, but struct `{}` has one; \
             to declare a table use #[derive(Row)] instead",
            input.ident
        );
        return Err(Error::new_spanned(attr, message));
    }
    let fields = named_fields(input, "Columns")?;
    for column in &fields {
        if let Some(attr) = column.field.attrs.iter().find(|a| is_row(a)) {
            let message = format!(
                "#[derive(Columns)] takes no `#[row(...)]` attributes, but field `{}` has one; \
                 field roles (owned, version, origin) belong to a #[derive(Row)] declaration",
                column.name
            );
            return Err(Error::new_spanned(attr, message));
        }
    }
    Ok(impl_columns(&input.ident, &fields))
}

/// `impl Columns for #owner`.
pub fn impl_columns(owner: &Ident, fields: &[ColumnField]) -> TokenStream {
    let columns = fields.iter().map(column);
    let to_values = fields.iter().map(to_value);
    let from_values = from_values(fields);
    quote! {
        #[automatically_derived]
        impl ::magic_sync::row::Columns for #owner {
            const COLUMNS: &'static [::magic_sync::row::Column] = &[#(#columns),*];

            fn to_values(&self) -> ::std::vec::Vec<::magic_sync::value::Value> {
                ::std::vec![#(#to_values),*]
            }

            #from_values
        }
    }
}

/// One `Column { .. }` entry; a field type that is no `Field` is reported at the type.
fn column(field: &ColumnField) -> TokenStream {
    let name = &field.name;
    let ty = field.ty;
    quote_spanned! {ty.span()=>
        ::magic_sync::row::Column {
            name: #name,
            kind: <#ty as ::magic_sync::value::Field>::KIND,
            nullable: <#ty as ::magic_sync::value::Field>::NULLABLE,
            checked: <#ty as ::magic_sync::value::Field>::CHECKED,
        }
    }
}

fn to_value(field: &ColumnField) -> TokenStream {
    let ident = field.ident;
    quote! { ::magic_sync::value::Field::to_value(&self.#ident) }
}

/// `from_values`: one value per column in field order; a missing value is NULL,
/// a surplus one is an error; each field's error names its column.
fn from_values(fields: &[ColumnField]) -> TokenStream {
    let count = fields.len();
    let inits = fields.iter().map(|field| {
        let ident = field.ident;
        let name = &field.name;
        quote! {
            #ident: ::magic_sync::value::Field::from_value(
                values.next().unwrap_or(::magic_sync::value::Value::Null),
            )
            .map_err(|e| e.in_column(#name))?
        }
    });
    quote! {
        fn from_values(
            values: ::std::vec::Vec<::magic_sync::value::Value>,
        ) -> ::std::result::Result<Self, ::magic_sync::value::ValueError> {
            if values.len() > #count {
                return ::std::result::Result::Err(::magic_sync::value::ValueError {
                    column: ::std::option::Option::None,
                    expected: ::std::format!("{} values", #count),
                    found: ::std::format!("{} values", values.len()),
                });
            }
            let mut values = values.into_iter();
            ::std::result::Result::Ok(Self { #(#inits),* })
        }
    }
}
