//! What the hub writes to its log of what others do wrong, kept to a line
//! a minute per kind, however many do it and from however many addresses:
//! the first of a kind is written as it comes; those after it within the
//! minute are counted, and the first one after the minute is written with
//! that count. A flood of wrong secrets, or a replica reconnecting to send
//! the same forged acknowledgement, costs the log a line a minute.

pub(crate) use magic_sync::core::logbook::since;

/// The hub's logbook: a line a minute per [`Kind`].
pub(crate) type Logbook = magic_sync::core::logbook::Logbook<Kind>;

/// What a line is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// A request without credentials the hub reads.
    NoCredentials,
    /// An id that cannot be a replica's.
    NotAnId,
    /// A wrong secret, or an id with none.
    WrongSecret,
    /// A secret that could not be checked: the database, too many waiting.
    CannotCheck,
    /// A connection closed as soon as accepted: too many open.
    Crowded,
    /// A connection that failed before it became a replica's: TLS, HTTP,
    /// the handshake's time.
    Handshake,
    /// A replica the relay found misbehaving.
    Misbehaved,
    /// A replica's connection closed for what it sent.
    Refused,
    /// A replica's connection lost.
    Lost,
}
