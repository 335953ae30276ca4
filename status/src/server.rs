//! The HTTP side (axum on tokio): the page, its JSON, a server-sent event stream of changes
//! and the Prometheus text. One thread reads the state DB every period and publishes what
//! changed; every request is served from the last publication, so the DB sees one reader
//! however many browsers watch.

use crate::StatusError;
use crate::auth::{self, Token};
use crate::snapshot::{self, History, Snapshot};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use control::state::StateDb;
use serde::Serialize;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

const PAGE: &str = include_str!("../assets/index.html");
const SCRIPT: &str = include_str!("../assets/app.js");
const STYLE: &str = include_str!("../assets/style.css");
const LOGIN: &str = include_str!("../assets/login.html");

/// The page with its style and script inside: one response, nothing else to fetch (or to
/// authenticate).
fn page_template() -> String {
    PAGE.replace("/*STYLE*/", STYLE)
        .replace("/*SCRIPT*/", SCRIPT)
}

#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The controller's state database.
    pub db: PathBuf,
    pub addr: SocketAddr,
    /// Required of every request when set; required to be set off loopback and for a DB
    /// another account owns.
    pub token: Option<Token>,
    /// How often the DB is read.
    pub period: Duration,
}

/// What the reader thread publishes: the snapshot as JSON and the latest samples as
/// Prometheus text.
#[derive(Debug, Default)]
struct Published {
    json: String,
    metrics: String,
}

#[derive(Serialize)]
struct Document<'a> {
    generated_ms: u64,
    db: String,
    period_ms: u64,
    #[serde(flatten)]
    snapshot: &'a Snapshot,
    /// Why the last read of the DB failed (the page says so rather than going stale).
    error: Option<String>,
}

#[derive(Clone)]
struct App {
    feed: watch::Receiver<Arc<Published>>,
    token: Option<Token>,
    bound: SocketAddr,
    page: Arc<str>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Reads the DB every period and publishes when something changed.
fn reader(opts: ServeOptions, tx: watch::Sender<Arc<Published>>) {
    let mut history = History::default();
    let mut db: Option<StateDb> = None;
    let mut last = (Snapshot::default(), None::<String>);
    loop {
        let read = match &db {
            Some(d) => snapshot::read(d, &mut history),
            None => StateDb::open(&opts.db)
                .map_err(StatusError::from)
                .and_then(|d| snapshot::read(db.insert(d), &mut history)),
        };
        let (snap, samples, error) = match read {
            Ok((s, samples)) => (s, samples, None),
            Err(e) => {
                db = None;
                (last.0.clone(), Vec::new(), Some(e.to_string()))
            }
        };
        if (&snap, &error) != (&last.0, &last.1) || tx.borrow().json.is_empty() {
            let doc = Document {
                generated_ms: now_ms(),
                db: opts.db.display().to_string(),
                period_ms: opts.period.as_millis() as u64,
                snapshot: &snap,
                error: error.clone(),
            };
            let metrics = if samples.is_empty() && error.is_some() {
                tx.borrow().metrics.clone()
            } else {
                monitor::prometheus_text(&samples)
            };
            let json = serde_json::to_string(&doc).unwrap_or_default();
            if tx.send(Arc::new(Published { json, metrics })).is_err() {
                return;
            }
            last = (snap, error);
        }
        std::thread::sleep(opts.period);
    }
}

/// Serves until the process ends. `listening` hears the bound address (port 0 picks one).
pub fn serve_blocking(
    opts: ServeOptions,
    listening: impl FnOnce(SocketAddr),
) -> Result<(), StatusError> {
    auth::require_token_off_loopback(opts.addr, opts.token.as_ref())?;
    if !opts.db.exists() {
        return Err(StatusError::Invalid(format!(
            "state database {} does not exist; hint: pass --db or set VSE_STATE_DB to the \
             controller's database",
            opts.db.display()
        )));
    }
    auth::require_token_for_foreign_db(&opts.db, opts.token.as_ref())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(StatusError::io("starting the HTTP runtime"))?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(opts.addr)
            .await
            .map_err(StatusError::io(format!("listening on {}", opts.addr)))?;
        let addr = listener
            .local_addr()
            .map_err(StatusError::io("reading the bound address"))?;
        let (tx, rx) = watch::channel(Arc::new(Published::default()));
        let app = App {
            feed: rx,
            token: opts.token.clone(),
            bound: addr,
            page: page_template().into(),
        };
        std::thread::spawn(move || reader(opts, tx));
        // Nobody is told where to connect before there is something to serve.
        let mut first = app.feed.clone();
        let _ = first.changed().await;
        listening(addr);
        let listener = crate::listen::Capped::new(listener, crate::listen::MAX_CONNECTIONS);
        axum::serve(listener, router(app))
            .await
            .map_err(StatusError::io("serving HTTP"))
    })
}

/// Longest login body: a form with one token field.
const LOGIN_BODY_MAX: usize = 4096;

fn router(app: App) -> axum::Router {
    axum::Router::new()
        .route("/", get(page))
        .route("/api/status", get(status_json))
        .route("/api/events", get(events))
        .route("/metrics", get(metrics))
        .route(
            "/login",
            post(login).layer(DefaultBodyLimit::max(LOGIN_BODY_MAX)),
        )
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

/// The `Host` check for every request, then the token for every one but the login itself.
async fn guard(State(app): State<App>, headers: HeaderMap, req: Request, next: Next) -> Response {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if !host.is_some_and(|h| auth::host_allowed(h, app.bound)) {
        return (
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "Host {} does not name this server; use its address ({}) or localhost\n",
                host.unwrap_or("(none)"),
                app.bound
            ),
        )
            .into_response();
    }
    let Some(token) = &app.token else {
        return next.run(req).await;
    };
    if req.uri().path() == "/login" {
        return next.run(req).await;
    }
    let text = |name| headers.get(name).and_then(|h| h.to_str().ok());
    if token.admits(text(header::AUTHORIZATION), text(header::COOKIE)) {
        return next.run(req).await;
    }
    if req.uri().path() == "/" {
        return (StatusCode::UNAUTHORIZED, Html(LOGIN)).into_response();
    }
    (
        StatusCode::UNAUTHORIZED,
        "token required: Authorization: Bearer TOKEN, or sign in on the page\n",
    )
        .into_response()
}

/// A form's (or the login page's script's) token for the page's cookie.
async fn login(State(app): State<App>, body: Bytes) -> Response {
    let Some(token) = &app.token else {
        return axum::response::Redirect::to("./").into_response();
    };
    match auth::form_token(&body) {
        Some(t) if token.matches(&t) => {
            let cookie = format!(
                "{}={}; Path=/; HttpOnly; SameSite=Strict",
                auth::COOKIE,
                token.cookie_value()
            );
            let mut r = axum::response::Redirect::to("./").into_response();
            if let Ok(v) = cookie.parse() {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        _ => (StatusCode::UNAUTHORIZED, Html(LOGIN)).into_response(),
    }
}

/// The page, with the current snapshot inside it: it renders before any request of its own.
async fn page(State(app): State<App>) -> Html<String> {
    let json = app.feed.borrow().json.clone();
    // `<` never occurs outside JSON strings; escaped, no string can end the script element.
    let seed = if json.is_empty() {
        "null".into()
    } else {
        json.replace('<', "\\u003c")
    };
    Html(app.page.replacen("/*SNAPSHOT*/null", &seed, 1))
}

async fn status_json(State(app): State<App>) -> Response {
    let json = app.feed.borrow().json.clone();
    ([(header::CONTENT_TYPE, "application/json")], json).into_response()
}

async fn metrics(State(app): State<App>) -> Response {
    let text = app.feed.borrow().metrics.clone();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// Server-sent events: the current snapshot at once, then each change.
async fn events(
    State(app): State<App>,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let stream = futures_util::stream::unfold((app.feed, true), |(mut rx, first)| async move {
        if !first && rx.changed().await.is_err() {
            return None;
        }
        let json = rx.borrow_and_update().json.clone();
        Some((Ok(Event::default().event("status").data(json)), (rx, false)))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}
