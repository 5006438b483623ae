//! async-openai's client paced by ratebucket: 200 chat completions fired at once through
//! two limits, against the fake provider. `cargo run -p ratebucket-async-openai --example paced`.

use std::time::{Duration, Instant};

use async_openai::config::OpenAIConfig;
use async_openai::middleware::ReqwestService;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequestArgs,
};
use ratebucket_async_openai::PaceLayer;
use ratebucket_openai::Limits;
use ratebucket_sim::{LimitSpec, Sim, SimConfig};
use tower::Layer;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 600 requests and 60,000 tokens per 5 s window (a real provider counts per minute;
    // this one is shortened so the example runs in seconds).
    let window = Duration::from_secs(5);
    let sim = Sim::start(
        SimConfig::default()
            .rpm(LimitSpec::per_minute(600).window(window))
            .tpm(LimitSpec::per_minute(60_000).window(window)),
    )?;

    let limits = Limits::per_minute(600, 60_000).window(window);
    let limiter = ratebucket_tokio::limiter_for(limits.per_dimension())?;
    let config = OpenAIConfig::new()
        .with_api_base(format!("{}/v1", sim.base_url()))
        .with_api_key("sk-local");
    let client = async_openai::Client::with_config(config)
        .with_http_service(PaceLayer::new(limiter, limits).layer(ReqwestService::default()));

    let start = Instant::now();
    let calls: Vec<_> = (0..200)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let request = CreateChatCompletionRequestArgs::default()
                    .model("gpt-4o-mini")
                    .messages([ChatCompletionRequestUserMessageArgs::default()
                        .content(format!("Summarise document {i}."))
                        .build()?
                        .into()])
                    .max_completion_tokens(200u32)
                    .build()?;
                client.chat().create(request).await
            })
        })
        .collect();
    let (mut done, mut tokens) = (0, 0);
    for call in calls {
        let response = call.await??;
        done += 1;
        tokens += response.usage.map_or(0, |u| u.total_tokens);
    }
    let throttled = sim.log().iter().filter(|e| e.status == Some(429)).count();
    println!(
        "{done} completions through async-openai, {tokens} tokens, {:.1} s, {throttled} answered 429",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
