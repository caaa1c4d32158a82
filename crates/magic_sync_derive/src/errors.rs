//! Collects several `syn::Error`s so one expansion reports every problem at once.

use proc_macro2::Span;

#[derive(Default)]
pub struct Errors(Option<syn::Error>);

impl Errors {
    pub fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    /// The value of `result`, or `None` after keeping its error.
    pub fn keep<T>(&mut self, result: syn::Result<T>) -> Option<T> {
        result.map_err(|e| self.push(e)).ok()
    }

    /// Fails with everything collected, if anything was.
    pub fn check(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }

    /// Everything collected, as one error (the caller saw a part missing).
    pub fn into_error(self) -> syn::Error {
        self.0.unwrap_or_else(|| {
            syn::Error::new(Span::call_site(), "magic_sync: incomplete declaration")
        })
    }
}
