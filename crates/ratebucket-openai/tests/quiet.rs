//! A healthy run says nothing at `info`: learning the provider's limits from its headers,
//! grants, waits and commits are all `debug` or below. In a process of its own, since the
//! subscriber is the thread's default.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ratebucket_openai::{ChatRequest, Client, Limits, Message};
use ratebucket_sim::{Latency, LimitSpec, Sim, SimConfig};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Every event at `info` or above, with its message.
#[derive(Clone, Default)]
struct Loud(Arc<Mutex<Vec<String>>>);

impl<S: Subscriber> Layer<S> for Loud {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() <= Level::INFO {
            self.0.lock().unwrap().push(format!("{event:?}"));
        }
    }
}

#[test]
fn a_healthy_batch_logs_nothing_at_info() {
    let loud = Loud::default();
    let subscriber = tracing_subscriber::registry().with(loud.clone());
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let window = Duration::from_millis(500);
    // The provider allows less than the client is told: the client learns its limits.
    let sim = Sim::start(
        SimConfig::default()
            .rpm(LimitSpec::per_minute(40).window(window))
            .tpm(LimitSpec::per_minute(40_000).window(window))
            .latency(Latency::Fixed(Duration::from_millis(2))),
    )
    .expect("sim starts");
    tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let client = Client::builder(sim.base_url())
                .limits(Limits::per_minute(60, 40_000).window(window))
                .build()
                .expect("client");
            let calls: Vec<_> = (0..30)
                .map(|i| {
                    let client = client.clone();
                    tokio::spawn(async move {
                        let request =
                            ChatRequest::new("m", vec![Message::user(format!("item {i}"))])
                                .max_tokens(20);
                        client.complete(request).await
                    })
                })
                .collect();
            for call in calls {
                call.await.expect("task").expect("completes");
            }
        })
    });
    let throttled = sim.log().iter().filter(|e| !e.admitted).count();
    assert_eq!(throttled, 0, "a healthy run");
    let loud = loud.0.lock().unwrap();
    assert!(loud.is_empty(), "{loud:#?}");
}
