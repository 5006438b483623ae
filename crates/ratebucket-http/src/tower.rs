//! A tower [`Layer`] that paces any `Service<http::Request<B>>` exactly as a [`Fetcher`]
//! does: reserve, wait for the gate, send, classify, fold the headers, commit or release,
//! retry.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use ratebucket_rt::Limiter;
use tower::ServiceExt;
use tower_layer::Layer;
use tower_service::Service;
use tracing::Instrument;

use crate::body::{Gathered, Replay, gather};
use crate::client::{Fetcher, read_run};
use crate::config::FetchConfig;
use crate::error::FetchError;
use crate::fetched::Fetched;
use crate::transport::{BoxError, SendFuture, Transport, TransportError, box_body};
use crate::vendor::{NoVendor, Vendor};

/// The cost of one request, per limiter dimension (an upper bound).
type CostFn = dyn Fn(&Request<Bytes>) -> Vec<u64> + Send + Sync;

/// Paces the service it wraps through a [`Limiter`], for an axum or hyper server calling
/// an upstream, or any client built from tower services.
///
/// Each request's body is read first (so the request can be replayed on a retry and
/// costed); each response is read whole, up to [`FetchConfig::max_body`], so it can be
/// classified and its headers folded. A final HTTP answer — a success, or an error the
/// retry policy gave up on — is passed on as the upstream sent it; the service fails only
/// when there is no answer to pass on (the limiter refused, the connection failed), with a
/// [`FetchError`] saying why.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let limiter: ratebucket_rt::Limiter = unimplemented!();
/// # let upstream = tower::service_fn(|_: http::Request<http_body_util::Full<bytes::Bytes>>| async {
/// #     Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(bytes::Bytes::new())))
/// # });
/// use ratebucket_http::{FetchConfig, tower::PaceLayer};
/// use tower::Layer;
///
/// // One request each, and one token per 4 bytes of body on a second dimension.
/// let layer = PaceLayer::new(limiter, FetchConfig::default())
///     .cost(|request| vec![1, request.body().len() as u64 / 4]);
/// let paced = layer.layer(upstream);
/// # let _ = paced; Ok(()) }
/// ```
pub struct PaceLayer<V = NoVendor> {
    limiter: Limiter,
    config: FetchConfig,
    vendor: Arc<V>,
    cost: Option<Arc<CostFn>>,
}

impl PaceLayer<NoVendor> {
    /// Paces through `limiter`, each request costing `config.cost`.
    pub fn new(limiter: Limiter, config: FetchConfig) -> PaceLayer<NoVendor> {
        PaceLayer { limiter, config, vendor: Arc::new(NoVendor), cost: None }
    }
}

impl<V: Vendor> PaceLayer<V> {
    /// Costs each request with `cost` instead of the fixed `config.cost`.
    pub fn cost(
        mut self,
        cost: impl Fn(&Request<Bytes>) -> Vec<u64> + Send + Sync + 'static,
    ) -> PaceLayer<V> {
        self.cost = Some(Arc::new(cost));
        self
    }

    /// Applies a vendor's knowledge (error bodies, rate-limit headers), shared by every
    /// service this layer makes.
    pub fn vendor<W: Vendor>(self, vendor: W) -> PaceLayer<W> {
        PaceLayer {
            limiter: self.limiter,
            config: self.config,
            vendor: Arc::new(vendor),
            cost: self.cost,
        }
    }
}

impl<V> Clone for PaceLayer<V> {
    fn clone(&self) -> Self {
        PaceLayer {
            limiter: self.limiter.clone(),
            config: self.config.clone(),
            vendor: Arc::clone(&self.vendor),
            cost: self.cost.clone(),
        }
    }
}

impl<V> fmt::Debug for PaceLayer<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PaceLayer")
            .field("limiter", &self.limiter)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S, V: Vendor> Layer<S> for PaceLayer<V> {
    type Service = Paced<S, V>;

    fn layer(&self, inner: S) -> Paced<S, V> {
        let engine = Fetcher::assemble(
            (),
            self.limiter.clone(),
            self.config.clone(),
            Arc::clone(&self.vendor),
        );
        Paced { inner, engine, cost: self.cost.clone() }
    }
}

/// The service [`PaceLayer`] makes. Cloning it clones the wrapped service and two shared
/// pointers (services are cloned per call).
pub struct Paced<S, V = NoVendor> {
    inner: S,
    /// The fetcher every call runs through, made once (each call brings its own transport:
    /// a clone of the wrapped service); the calls draw their retry jitter from its one
    /// generator, so no two back off in step.
    engine: Fetcher<(), Arc<V>>,
    /// The layer's cost function, if it has one.
    cost: Option<Arc<CostFn>>,
}

impl<S: Clone, V> Clone for Paced<S, V> {
    fn clone(&self) -> Self {
        Paced { inner: self.inner.clone(), engine: self.engine.clone(), cost: self.cost.clone() }
    }
}

impl<S, V> fmt::Debug for Paced<S, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Paced").field("engine", &self.engine).finish_non_exhaustive()
    }
}

impl<S, V> Paced<S, V> {
    /// The limiter it paces with.
    pub fn limiter(&self) -> &Limiter {
        self.engine.limiter()
    }
}

/// The wrapped service as a [`Transport`] taking `Request<B>`: one clone of it per send.
struct ServiceTransport<S, B> {
    inner: Mutex<S>,
    body: PhantomData<fn(B)>,
}

impl<S, B, RB> Transport for ServiceTransport<S, B>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: From<Bytes> + Send + 'static,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    fn send(&self, request: Request<Bytes>) -> SendFuture<'_> {
        let service = self.inner.lock().unwrap_or_else(PoisonError::into_inner).clone();
        Box::pin(async move {
            let response = service
                .oneshot(request.map(B::from))
                .await
                .map_err(|e| TransportError::new(e.into()))?;
            Ok(response.map(box_body))
        })
    }
}

impl<S, V, B, RB> Service<Request<B>> for Paced<S, V>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    V: Vendor,
    B: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<Full<Bytes>>;
    type Error = FetchError;
    type Future = PacedFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), FetchError>> {
        // The limiter is the back-pressure: a call waits in its queue, not here.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let engine = self.engine.clone();
        let transport =
            ServiceTransport { inner: Mutex::new(self.inner.clone()), body: PhantomData };
        let cost_of = self.cost.clone();
        let (parts, body) = request.into_parts();
        // One box for the whole call, in two steps that share its room: the body is read,
        // then the fetcher's run (owning the fetcher, the transport and the request it
        // replays from) takes the place of the read.
        Box::pin(TwoStep::First {
            first: gather(body, usize::MAX),
            next: Some(move |gathered: Result<Bytes, Gathered>| {
                let bytes = gathered.map_err(unreadable)?;
                let request = Request::from_parts(parts, bytes);
                let costed = cost_of.as_ref().map(|cost| cost(&request));
                let span = engine.call_span(costed.as_deref().unwrap_or(&engine.config().cost));
                // Boxed: the call's future stays small enough for the allocator's quick
                // sizes, and each attempt copies from here.
                let attempts = Replay(Box::new(request));
                Ok(read_run::<(), Arc<V>, ServiceTransport<S, B>>(
                    engine, transport, costed, attempts,
                )
                .instrument(span))
            }),
        })
    }
}

pin_project_lite::pin_project! {
    /// A future that runs `first`, makes the second future (the fetcher's run) from its
    /// output with `next` (or fails with the error `next` returns), runs that in the same
    /// room, and passes its answer on as a response.
    #[project = TwoStepNow]
    enum TwoStep<A, B, F> {
        First { #[pin] first: A, next: Option<F> },
        Second { #[pin] second: B },
    }
}

impl<A, B, F> Future for TwoStep<A, B, F>
where
    A: Future,
    B: Future<Output = Result<Fetched, FetchError>>,
    F: FnOnce(A::Output) -> Result<B, FetchError>,
{
    type Output = Result<Response<Full<Bytes>>, FetchError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match self.as_mut().project() {
                TwoStepNow::First { first, next } => {
                    let output = std::task::ready!(first.poll(cx));
                    let next = next.take().expect("`TwoStep` polled after completion");
                    let second = next(output)?;
                    self.set(TwoStep::Second { second });
                }
                TwoStepNow::Second { second } => {
                    // A final HTTP answer is passed on as the upstream sent it.
                    return Poll::Ready(match std::task::ready!(second.poll(cx)) {
                        Ok(fetched) => Ok(fetched.response.map(Full::new)),
                        Err(error) => error.into_response_or_self().map(|r| r.map(Full::new)),
                    });
                }
            }
        }
    }
}

/// The error of a request body that could not be read.
fn unreadable(e: Gathered) -> FetchError {
    let why = match e {
        Gathered::Failed(e) => e,
        Gathered::TooBig => "longer than memory".into(),
    };
    FetchError::config(format!("the request body could not be read: {why}"))
}

/// What [`Paced`] returns for each call.
type PacedFuture = Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, FetchError>> + Send>>;
