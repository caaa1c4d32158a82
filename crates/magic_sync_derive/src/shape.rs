//! What kind of item a derive accepts: a non-generic struct with named fields.

use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Error, Field, Fields, Ident, Result, Type};

/// One field of the struct and the column it stands for.
pub struct ColumnField<'a> {
    pub field: &'a Field,
    pub ident: &'a Ident,
    pub ty: &'a Type,
    /// The column name: the field's name without any `r#`.
    pub name: String,
}

/// The struct's fields, or an error saying why `derive` does not take `input`.
pub fn named_fields<'a>(input: &'a DeriveInput, derive: &str) -> Result<Vec<ColumnField<'a>>> {
    let owner = &input.ident;
    reject_generics(input, derive)?;
    let fields = match &input.data {
        Data::Struct(data) => &data.fields,
        Data::Enum(data) => {
            return Err(not_a_struct(data.enum_token.span, derive, owner, "an enum"))
        }
        Data::Union(data) => {
            return Err(not_a_struct(
                data.union_token.span,
                derive,
                owner,
                "a union",
            ))
        }
    };
    let named = match fields {
        Fields::Named(named) => named,
        Fields::Unnamed(_) => {
            return Err(not_a_struct(fields.span(), derive, owner, "a tuple struct"))
        }
        Fields::Unit => return Err(not_a_struct(owner.span(), derive, owner, "a unit struct")),
    };
    if named.named.is_empty() {
        let message = format!("#[derive({derive})]: struct `{owner}` has no fields; a table needs at least one column");
        return Err(Error::new(owner.span(), message));
    }
    Ok(named.named.iter().filter_map(column_field).collect())
}

fn column_field(field: &Field) -> Option<ColumnField<'_>> {
    let ident = field.ident.as_ref()?;
    Some(ColumnField {
        field,
        ident,
        ty: &field.ty,
        name: syn::ext::IdentExt::unraw(ident).to_string(),
    })
}

fn reject_generics(input: &DeriveInput, derive: &str) -> Result<()> {
    if input.generics.params.is_empty() {
        return Ok(());
    }
    let message = format!(
        "#[derive({derive})] does not take generic structs: `{}` must name concrete field types",
        input.ident
    );
    Err(Error::new_spanned(&input.generics, message))
}

fn not_a_struct(span: proc_macro2::Span, derive: &str, owner: &Ident, what: &str) -> Error {
    let message =
        format!("#[derive({derive})] needs a struct with named fields, and `{owner}` is {what}");
    Error::new(span, message)
}
