//! Routes, authentication, body limits, and the model/health/metrics endpoints.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::daemon::{AdminQuery, Pool};
use crate::error::ApiError;
use crate::generation;
use crate::metrics::Metrics;
use crate::request::{self, Endpoint};

/// Gateway settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Bearer token required on `/v1/*` (None: open).
    pub api_key: Option<String>,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Name served instead of the daemon's model name.
    pub served_model_name: Option<String>,
    /// `max_tokens` of a completions request that names none (OpenAI's default is 16).
    pub default_completion_tokens: u32,
}

/// The daemon's model as the gateway serves it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// The id clients must send as `model`.
    pub id: String,
    /// The daemon's longest sequence.
    pub max_context: u32,
}

/// Shared by every handler.
pub struct AppState {
    /// Daemon connections.
    pub pool: Arc<Pool>,
    /// Counters and histograms.
    pub metrics: Metrics,
    settings: Settings,
    model: Mutex<Option<ModelInfo>>,
    started: u64,
}

impl AppState {
    /// New state over `pool`.
    pub fn new(pool: Arc<Pool>, settings: Settings) -> Arc<AppState> {
        Arc::new(AppState {
            pool,
            metrics: Metrics::new(),
            settings,
            model: Mutex::new(None),
            started: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        })
    }

    async fn admin(&self, query: AdminQuery) -> Result<Value, ApiError> {
        let pool = Arc::clone(&self.pool);
        let text = tokio::task::spawn_blocking(move || pool.admin(query))
            .await
            .map_err(|e| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal_error",
                    e.to_string(),
                )
            })?
            .map_err(|_| ApiError::unavailable())?;
        serde_json::from_str(&text).map_err(|e| {
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                "daemon_error",
                format!("daemon status is not JSON: {e}"),
            )
        })
    }

    /// The daemon's status, refreshing the cached model info.
    async fn status(&self) -> Result<Value, ApiError> {
        let status = self.admin(AdminQuery::Status).await?;
        let name = status
            .pointer("/model/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let info = ModelInfo {
            id: self.settings.served_model_name.clone().unwrap_or(name),
            max_context: status
                .pointer("/model/max_context")
                .and_then(Value::as_u64)
                .unwrap_or(0) as u32,
        };
        *self.model.lock().unwrap_or_else(|p| p.into_inner()) = Some(info);
        Ok(status)
    }

    /// The served model (cached after the first status query).
    pub async fn model(&self) -> Result<ModelInfo, ApiError> {
        if let Some(m) = self.model.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(m);
        }
        self.status().await?;
        self.model
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(ApiError::unavailable)
    }

    fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(key) = &self.settings.api_key else {
            return Ok(());
        };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes())) {
            Ok(())
        } else {
            Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_api_key",
                "missing or wrong API key: send 'Authorization: Bearer <key>'",
            ))
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The router.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
}

async fn chat(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    generate(state, headers, body, Endpoint::Chat).await
}

async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    generate(state, headers, body, Endpoint::Completions).await
}

async fn generate(
    state: Arc<AppState>,
    headers: HeaderMap,
    body: Body,
    endpoint: Endpoint,
) -> Response {
    let received = Instant::now();
    let result = async {
        state.authorize(&headers)?;
        let limit = state.settings.max_body_bytes;
        let bytes = axum::body::to_bytes(body, limit).await.map_err(|_| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("request body larger than {limit} bytes"),
            )
        })?;
        let model = state.model().await?;
        let default_max = match endpoint {
            Endpoint::Chat => model.max_context.max(1),
            Endpoint::Completions => state.settings.default_completion_tokens,
        };
        let req = request::parse(&bytes, endpoint, default_max)?;
        if req.model != model.id {
            return Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!(
                    "the model '{}' does not exist; this server serves '{}'",
                    req.model, model.id
                ),
                param: Some("model"),
                code: Some("model_not_found"),
            });
        }
        generation::respond(Arc::clone(&state), req, model.id, received).await
    }
    .await;
    let endpoint_index = match endpoint {
        Endpoint::Chat => 0,
        Endpoint::Completions => 1,
    };
    let response = match result {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    state
        .metrics
        .request(endpoint_index, response.status().as_u16());
    state.metrics.request_duration.observe(received.elapsed());
    response
}

fn model_json(state: &AppState, m: &ModelInfo) -> Value {
    json!({
        "id": m.id,
        "object": "model",
        "created": state.started,
        "owned_by": "nerva",
        "max_model_len": m.max_context,
    })
}

async fn models(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let result = async {
        state.authorize(&headers)?;
        let m = state.model().await?;
        Ok::<_, ApiError>(axum::Json(
            json!({"object": "list", "data": [model_json(&state, &m)]}),
        ))
    }
    .await;
    result.into_response()
}

async fn model(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let result = async {
        state.authorize(&headers)?;
        let m = state.model().await?;
        if id != m.id {
            return Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!("the model '{id}' does not exist"),
                param: Some("model"),
                code: Some("model_not_found"),
            });
        }
        Ok(axum::Json(model_json(&state, &m)))
    }
    .await;
    result.into_response()
}

/// 200 when the daemon answers and has a model loaded, 503 otherwise.
async fn health(State(state): State<Arc<AppState>>) -> Response {
    match state.status().await {
        Ok(status) => {
            let model = status
                .pointer("/model/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let draining = status
                .pointer("/daemon/draining")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let ok = !model.is_empty() && !draining;
            let body = json!({
                "status": if ok { "ok" } else { "unavailable" },
                "daemon": "reachable",
                "model": model,
                "draining": draining,
                "connections_up": state.pool.connected(),
            });
            let code = if ok {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            (code, axum::Json(body)).into_response()
        }
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({
                "status": "unavailable",
                "daemon": "unreachable",
                "error": e.message,
            })),
        )
            .into_response(),
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let status = state.status().await.ok();
    let (stats, clients) = if status.is_some() {
        (
            state.admin(AdminQuery::Stats).await.ok(),
            state.admin(AdminQuery::Clients).await.ok(),
        )
    } else {
        (None, None)
    };
    let text = state.metrics.render(
        state.pool.active(),
        state.pool.connected(),
        status.as_ref(),
        stats.as_ref(),
        clients.as_ref(),
    );
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
