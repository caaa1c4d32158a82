//! Where the command's logs and the engine's spans go: standard error, and
//! an OpenTelemetry collector when the environment names one (the `otlp`
//! feature).

/// Sends what the engine and the transport log to standard error: warnings
/// and worse, or as `RUST_LOG` says (`RUST_LOG=magic_sync=debug` times every
/// step of a pass). With `OTEL_EXPORTER_OTLP_ENDPOINT` (or
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set, the engine's spans go to that
/// OpenTelemetry collector too, over OTLP/HTTP (the `otlp` feature, on by
/// default): a pass, publishing, hearing replicas and each snapshot, with
/// the steps' timings as events within them, whatever `RUST_LOG` says of
/// standard error. They go in batches, every five seconds
/// (`OTEL_BSP_SCHEDULE_DELAY`) and at [`flush_traces`]. For the command's
/// binary and a host's own; a host with a subscriber of its own does not
/// call it, and adds `tracing-opentelemetry`'s layer itself.
pub fn logs() {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(filter);
    let registry = tracing_subscriber::registry().with(stderr);
    #[cfg(feature = "otlp")]
    let registry = registry.with(otlp::layer());
    let _ = registry.try_init();
}

/// Sends the spans not exported yet to the collector, if traces are
/// exported (see [`logs`]); a process calls it before it exits.
pub fn flush_traces() {
    #[cfg(feature = "otlp")]
    otlp::flush();
}

#[cfg(feature = "otlp")]
mod otlp {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use std::sync::OnceLock;
    use tracing_subscriber::Layer as _;

    /// The exporter's provider, once made: flushed by `flush`.
    static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

    /// The layer exporting the engine's spans, when the environment names
    /// a collector; `None` otherwise, or when the exporter cannot be made
    /// (said on standard error: the process runs on without it).
    pub(super) fn layer<S>() -> Option<impl tracing_subscriber::Layer<S>>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        let named = [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()));
        if !named {
            return None;
        }
        let exporter = match opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
        {
            Ok(exporter) => exporter,
            Err(e) => {
                #[allow(clippy::print_stderr, reason = "logging is what failed to start")]
                {
                    eprintln!("magic-sync: traces are not exported: {e}");
                }
                return None;
            }
        };
        let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "magic_sync".into());
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name(service)
                    .build(),
            )
            .build();
        let tracer = provider.tracer("magic_sync");
        let _ = PROVIDER.set(provider);
        // The engine's spans and what happens within them; the exporter's
        // own logs never, or exporting would trace itself.
        let targets = tracing_subscriber::filter::Targets::new()
            .with_target("magic_sync", tracing::Level::INFO)
            .with_target("magic_sync_server", tracing::Level::INFO)
            .with_target("magic_sync_http", tracing::Level::INFO)
            .with_target("magic_sync_nats", tracing::Level::INFO);
        Some(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(targets),
        )
    }

    pub(super) fn flush() {
        if let Some(provider) = PROVIDER.get() {
            let _ = provider.force_flush();
        }
    }
}
