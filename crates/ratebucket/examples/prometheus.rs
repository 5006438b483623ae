//! A batch against the fake provider with every limiter metric exported to Prometheus; the
//! scrape is printed at the end:
//! `cargo run -p ratebucket --features sim,metrics --example prometheus`.
//!
//! The provider allows fewer requests than the client is told: the limiter learns the real
//! limit from the first replies' headers, and the scrape shows it (the rate and window
//! gauges) beside grants, waits and their durations, refunds, levels and attempts by class.

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use ratebucket::openai::{ChatRequest, Client, Limits, Message};
use ratebucket::sim::{LimitSpec, Sim, SimConfig};
use ratebucket::tokio;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let recorder = PrometheusBuilder::new().build_recorder();
    let scrape = recorder.handle();
    metrics::set_global_recorder(recorder)?;

    // One-second windows keep the run short; the provider allows 20 requests a window,
    // the client is told 30.
    let window = Duration::from_secs(1);
    let sim = Sim::start(
        SimConfig::default()
            .rpm(LimitSpec::per_minute(20).window(window))
            .tpm(LimitSpec::per_minute(20_000).window(window)),
    )?;
    let client = Client::builder(sim.base_url())
        .name("sim/gpt-4o-mini")
        .limits(Limits::per_minute(30, 20_000).window(window))
        .build()?;

    let calls = (0..60).map(|i| {
        let client = client.clone();
        tokio::spawn(async move {
            let request =
                ChatRequest::new("gpt-4o-mini", vec![Message::user(format!("Item {i}."))])
                    .max_tokens(40);
            client.complete(request).await
        })
    });
    let mut failed = 0;
    for call in calls.collect::<Vec<_>>() {
        if let Err(e) = call.await? {
            eprintln!("{e}");
            failed += 1;
        }
    }
    let throttled = sim.log().iter().filter(|entry| !entry.admitted).count();
    println!("# 60 calls, {failed} failed, {throttled} refused by the provider\n");
    for line in scrape.render().lines() {
        if line.starts_with("ratebucket_") || line.starts_with("# TYPE ratebucket_") {
            println!("{line}");
        }
    }
    Ok(())
}
