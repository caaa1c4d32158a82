//! The broker transport against a real `nats-server` (started by each test,
//! as PostgreSQL is) and a real relay: what replicas may reach, and the
//! random walk through the broker across its restart, and TLS to it.

mod access;
mod tls;
mod walk;
