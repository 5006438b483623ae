//! The layer and its service: async-openai's request factory in, the fetcher's loop
//! around the service it wraps.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use async_openai::error::OpenAIError;
use async_openai::middleware::HttpRequestFactory;
use bytes::Bytes;
use ratebucket_http::{
    FetchConfig, Fetcher, ResponseBody, SendFuture, Transport, TransportError, box_body,
    copy_request, reqwest_failure,
};
use ratebucket_openai::{
    CharsPerToken, ChatRequest, Limits, OpenAiVendor, REQUESTS, TokenEstimator, call_cost,
};
use ratebucket_rt::Limiter;
use tower::ServiceExt;
use tower_layer::Layer;
use tower_service::Service;

/// Paces async-openai's HTTP service through a two-dimension [`Limiter`] (requests,
/// tokens) made from the same [`Limits`].
pub struct PaceLayer {
    limiter: Limiter,
    vendor: Arc<OpenAiVendor>,
    config: FetchConfig,
    default_max_tokens: u64,
}

impl PaceLayer {
    /// Paces through `limiter`, built from `limits` (for instance with
    /// `Limiter::from_limits(limits.per_dimension(), ...)`). The provider's headers refine
    /// the limits as they arrive.
    pub fn new(limiter: Limiter, limits: Limits) -> PaceLayer {
        PaceLayer {
            limiter,
            vendor: Arc::new(OpenAiVendor::new(limits)),
            config: FetchConfig::default(),
            default_max_tokens: 4096,
        }
    }

    /// Retries, timeouts and body limits.
    pub fn fetch(mut self, config: FetchConfig) -> PaceLayer {
        self.config = config;
        self
    }

    /// The completion limit reserved when a request sets none (4096 by default).
    pub fn default_max_tokens(mut self, tokens: u64) -> PaceLayer {
        self.default_max_tokens = tokens;
        self
    }

    /// The limiter it paces with.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }
}

impl Clone for PaceLayer {
    fn clone(&self) -> Self {
        PaceLayer {
            limiter: self.limiter.clone(),
            vendor: Arc::clone(&self.vendor),
            config: self.config.clone(),
            default_max_tokens: self.default_max_tokens,
        }
    }
}

impl fmt::Debug for PaceLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PaceLayer")
            .field("limiter", &self.limiter)
            .field("config", &self.config)
            .field("default_max_tokens", &self.default_max_tokens)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for PaceLayer {
    type Service = Paced<S>;

    fn layer(&self, inner: S) -> Paced<S> {
        Paced { inner, layer: self.clone(), calls: Arc::new(AtomicU64::new(0)) }
    }
}

/// async-openai's HTTP service, paced: what [`PaceLayer`] makes.
pub struct Paced<S> {
    inner: S,
    layer: PaceLayer,
    calls: Arc<AtomicU64>,
}

impl<S: Clone> Clone for Paced<S> {
    fn clone(&self) -> Self {
        Paced {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
            calls: Arc::clone(&self.calls),
        }
    }
}

impl<S> fmt::Debug for Paced<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Paced").field("layer", &self.layer).finish_non_exhaustive()
    }
}

impl<S> Service<HttpRequestFactory> for Paced<S>
where
    S: Service<HttpRequestFactory, Response = reqwest::Response, Error = OpenAIError>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    type Response = reqwest::Response;
    type Error = OpenAIError;
    type Future = Pin<Box<dyn Future<Output = Result<reqwest::Response, OpenAIError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), OpenAIError>> {
        // The limiter is the back-pressure: a call waits in its queue, not here.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, factory: HttpRequestFactory) -> Self::Future {
        let layer = self.layer.clone();
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        let config = layer.config.for_call(call);
        let transport =
            FactoryTransport { inner: Mutex::new(self.inner.clone()), service: PhantomData };
        let fetcher = Fetcher::with_vendor(
            transport,
            layer.limiter.clone(),
            config,
            Arc::clone(&layer.vendor),
        );
        Box::pin(async move {
            let request = to_http(factory.build().await?)?;
            let (cost, streamed) = cost_of(&request, &layer);
            let build = move |_| copy_request(&request);
            if streamed {
                return match fetcher.open(&cost, build).await {
                    Ok(opened) => {
                        // Sent: charged as reserved (the usage comes in the stream,
                        // which the caller reads).
                        opened.reservation.keep();
                        let response = opened
                            .response
                            .map(|body| reqwest::Body::wrap(SyncBody(Mutex::new(body))));
                        Ok(reqwest::Response::from(response))
                    }
                    Err(error) => answer_or_error(error),
                };
            }
            match fetcher.fetch_costed(&cost, build).await {
                Ok(fetched) => Ok(reqwest::Response::from(fetched.response)),
                Err(error) => answer_or_error(error),
            }
        })
    }
}

/// A final answer goes to async-openai as the server sent it; no answer is an error.
fn answer_or_error(error: ratebucket_http::FetchError) -> Result<reqwest::Response, OpenAIError> {
    match error.into_response_or_self() {
        Ok(response) => Ok(reqwest::Response::from(response)),
        Err(error) => Err(OpenAIError::Boxed(Box::new(error))),
    }
}

/// The request async-openai built, as an `http::Request` whose body can be replayed.
fn to_http(request: reqwest::Request) -> Result<http::Request<Bytes>, OpenAIError> {
    let body = match request.body() {
        None => Bytes::new(),
        Some(body) => match body.as_bytes() {
            Some(bytes) => Bytes::copy_from_slice(bytes),
            None => {
                return Err(OpenAIError::InvalidArgument(
                    "a streamed request body cannot be paced (it could not be re-sent)".into(),
                ));
            }
        },
    };
    let mut converted = http::Request::new(body);
    *converted.method_mut() = request.method().clone();
    *converted.uri_mut() = request
        .url()
        .as_str()
        .parse()
        .map_err(|e| OpenAIError::InvalidArgument(format!("request URL: {e}")))?;
    converted.headers_mut().clone_from(request.headers());
    Ok(converted)
}

/// One request and the tokens a chat completion can use (its prompt estimate plus its
/// completion limit for each of its `n` choices, capped as [`call_cost`] caps them), and
/// whether it asks for a stream. Any other request (a model list, an embedding) costs one
/// request and no tokens.
fn cost_of(request: &http::Request<Bytes>, layer: &PaceLayer) -> (Vec<u64>, bool) {
    let Ok(chat) = serde_json::from_slice::<ChatRequest>(request.body()) else {
        let mut cost = vec![0; 2];
        cost[REQUESTS] = 1;
        return (cost, false);
    };
    let estimate = chat.token_bound(CharsPerToken.prompt_tokens(&chat), layer.default_max_tokens);
    (call_cost(estimate, &layer.limiter), chat.stream == Some(true))
}

/// The wrapped service as a [`Transport`]: each send hands it a factory that yields the
/// request.
struct FactoryTransport<S> {
    inner: Mutex<S>,
    service: PhantomData<fn(S)>,
}

impl<S> Transport for FactoryTransport<S>
where
    S: Service<HttpRequestFactory, Response = reqwest::Response, Error = OpenAIError>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    fn send(&self, request: http::Request<Bytes>) -> SendFuture<'_> {
        let service = self.inner.lock().unwrap_or_else(PoisonError::into_inner).clone();
        Box::pin(async move {
            let request = reqwest::Request::try_from(request.map(reqwest::Body::from))
                .map_err(reqwest_failure)?;
            let request = Arc::new(request);
            let factory = HttpRequestFactory::new(move || {
                let request = request.try_clone().ok_or_else(|| {
                    OpenAIError::InvalidArgument("the request cannot be copied".into())
                });
                async move { request }
            });
            match service.oneshot(factory).await {
                Ok(response) => Ok(http::Response::from(response).map(box_body)),
                Err(OpenAIError::Reqwest(e)) => Err(reqwest_failure(e)),
                Err(other) => Err(TransportError::new(other)),
            }
        })
    }
}

/// A response body reqwest can hold (it wants `Sync`; a body is only ever polled through
/// `&mut`, so the lock is never contended).
struct SyncBody(Mutex<ResponseBody>);

impl http_body::Body for SyncBody {
    type Data = Bytes;
    type Error = ratebucket_http::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let body = self.get_mut().0.get_mut().unwrap_or_else(PoisonError::into_inner);
        Pin::new(body).poll_frame(cx)
    }
}
