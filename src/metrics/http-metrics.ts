import type { IncomingMessage, ServerResponse } from 'node:http';
import { Counter, Gauge, type Registry } from 'prom-client';
import type { PartObserver } from '../http/loopback-service.js';
import type { AccessRecord } from '../http/request-pipeline.js';
import { HotHistogram } from './hot-histogram.js';
import { CappedLabel, errorTypeOf, LabelIndex, MAX_DISTINCT, MAX_LABEL_LENGTH, MAX_PER_OWNER, MCP_METHOD_COUNT, mcpMethodLabel, METHOD_COUNT, methodLabel, routeIndexOf, routeOf, ROUTES, statusCodeOf, statusLabel, TOKEN_FAILURE_REASONS, tokenReasonLabel, type RouteLabel } from './labels.js';

/** OpenTelemetry's recommended boundaries for http.server.request.duration, seconds. */
const DURATION_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10];

// How many values each indexed label can take (its fixed set plus `_OTHER`; tools: the cap
// plus `_other`, `_invalid` and none), so that every label set has its own key.
const METHOD_SLOTS = METHOD_COUNT + 1;
const MCP_METHOD_SLOTS = MCP_METHOD_COUNT + 1;
const TOOL_SLOTS = MAX_DISTINCT + 3;

function routeTotals(): Record<RouteLabel, number> {
  return { mcp: 0, provider: 0, healthz: 0, other: 0 };
}

/** The hot-reloaded file a loopback part serves from. */
export type ConfigFile = 'instances.json' | 'providers.json';

/** After an upstream 401: retried with a renewed token, refused again, or no renewed token came. */
export const UNAUTHORIZED_RESULTS = ['retried', 'retry_rejected', 'no_renewed_token'] as const;

/**
 * The metrics of a loopback proxy part (forwarder, cli-proxy), all read off the request's
 * access record when it closes: the record already holds the shape of the call (never a
 * value), so the handlers need no metric calls of their own besides the stream gauge.
 */
export function createHttpMetrics(registry: Registry, configFile: ConfigFile): PartObserver {
  const registers = [registry];
  const duration = new HotHistogram({
    name: 'http_server_request_duration_seconds',
    help: 'Duration of HTTP server requests (OpenTelemetry http.server.request.duration); an SSE stream counts until it ends.',
    labelNames: ['http_route', 'http_request_method', 'http_response_status_code', 'error_type'] as const,
    buckets: DURATION_BUCKETS,
    registers,
  });
  const mcp = new HotHistogram({
    name: 'mcp_server_operation_duration_seconds',
    help: 'Duration of MCP requests forwarded (OpenTelemetry mcp.server.operation.duration), by JSON-RPC method and tool.',
    labelNames: ['mcp_method_name', 'gen_ai_tool_name', 'error_type'] as const,
    buckets: DURATION_BUCKETS,
    registers,
  });
  // Summed here and handed over at the scrape: two fewer prom-client calls per request
  // (each validates and hashes its labels), which the profile showed.
  const bytes = { in: routeTotals(), out: routeTotals() };
  const bytesCounter = (name: string, help: string, totals: Record<RouteLabel, number>): void => {
    new Counter({
      name,
      help,
      labelNames: ['http_route'] as const,
      registers,
      collect() {
        this.reset();
        for (const route of ROUTES) this.inc({ http_route: route }, totals[route]);
      },
    });
  };
  bytesCounter('agent_connectors_request_body_bytes_total', 'Request body bytes received from agents and CLIs.', bytes.in);
  bytesCounter('agent_connectors_response_body_bytes_total', 'Upstream response body bytes passed to agents and CLIs.', bytes.out);
  const streams = new Gauge({
    name: 'agent_connectors_open_streams',
    help: 'Event streams (text/event-stream answers) open now.',
    labelNames: ['http_route'] as const,
    registers,
  });
  const tokenFailures = new Counter({
    name: 'agent_connectors_token_read_failures_total',
    help: 'Requests answered 503 token_unavailable, by why the token file could not be used.',
    labelNames: ['reason'] as const,
    registers,
  });
  const unauthorized = new Counter({
    name: 'agent_connectors_upstream_unauthorized_total',
    help: 'Upstream 401 answers met by a request, by what the token rotation bridge made of them.',
    labelNames: ['result'] as const,
    registers,
  });
  const reflected = new Counter({
    name: 'agent_connectors_response_headers_token_dropped_total',
    help: 'Upstream response headers dropped because they held the token injected into the request (an upstream reflecting it).',
    registers,
  });
  const reloads = new Counter({
    name: 'agent_connectors_config_reloads_total',
    help: 'Loads of the hot-reloaded config file, by result (a rejected file leaves the last good one in force).',
    labelNames: ['file', 'result'] as const,
    registers,
  });
  const lastOk = new Gauge({
    name: 'agent_connectors_config_last_reload_successful',
    help: '1 if the last load of the config file succeeded, 0 if it was rejected and the last good one is served.',
    labelNames: ['file'] as const,
    registers,
  });
  const lastOkTime = new Gauge({
    name: 'agent_connectors_config_last_reload_success_timestamp_seconds',
    help: 'When the config file last loaded successfully.',
    labelNames: ['file'] as const,
    registers,
  });
  const entries = new Gauge({
    name: 'agent_connectors_config_entries',
    help: 'Entries (bindings or providers) served now.',
    labelNames: ['file'] as const,
    registers,
  });
  // Zero series up front: a counter that appears only at its first event hides that event from rate().
  for (const reason of TOKEN_FAILURE_REASONS) tokenFailures.inc({ reason }, 0);
  for (const result of UNAUTHORIZED_RESULTS) unauthorized.inc({ result }, 0);
  reflected.inc(0);
  for (const result of ['ok', 'rejected']) reloads.inc({ file: configFile, result }, 0);
  for (const route of ROUTES) streams.set({ http_route: route }, 0);
  const tools = new CappedLabel(MAX_DISTINCT, MAX_LABEL_LENGTH, MAX_PER_OWNER);
  const toolIndex = new LabelIndex();
  const errorTypes = new LabelIndex();
  const methods = new LabelIndex();
  const mcpMethods = new LabelIndex();

  return {
    closed(req: IncomingMessage, rec: AccessRecord, seconds: number): void {
      // Runs once per request: the series is found by a number made of label indices
      // (no key string, no label object, no closure); labels are built once per series.
      const routeIndex = routeIndexOf(req.url);
      const route = ROUTES[routeIndex];
      const status = rec.status;
      const errorType = errorTypeOf(rec.outcome) ?? (status !== undefined && status >= 500 ? String(status) : '');
      const error = errorTypes.of(errorType);
      const method = methods.of(methodLabel(rec.method));
      const code = statusCodeOf(status);
      const key = ((error * 600 + code) * METHOD_SLOTS + method) * ROUTES.length + routeIndex;
      const series =
        duration.seriesAt(key) ??
        duration.addSeries(key, { http_route: route, http_request_method: methodLabel(rec.method), http_response_status_code: statusLabel(status), error_type: errorType });
      duration.record(series, seconds);
      bytes.in[route] += rec.bytesIn;
      bytes.out[route] += rec.bytesOut;
      if (typeof rec.mcpMethod === 'string') {
        const mcpMethod = mcpMethodLabel(rec.mcpMethod);
        const tool = mcpMethod === 'tools/call' && typeof rec.tool === 'string' ? tools.of(rec.tool, typeof rec.peerUid === 'number' ? rec.peerUid : undefined) : '';
        const mcpKey = (error * MCP_METHOD_SLOTS + mcpMethods.of(mcpMethod)) * TOOL_SLOTS + toolIndex.of(tool);
        const mcpSeries = mcp.seriesAt(mcpKey) ?? mcp.addSeries(mcpKey, { mcp_method_name: mcpMethod, gen_ai_tool_name: tool, error_type: errorType });
        mcp.record(mcpSeries, seconds);
      }
      if (rec.tokenProblem !== undefined) tokenFailures.inc({ reason: tokenReasonLabel(rec.tokenProblem) });
      if (rec.retried === true) unauthorized.inc({ result: rec.outcome === 'token_rejected' ? 'retry_rejected' : 'retried' });
      else if (rec.outcome === 'token_rejected') unauthorized.inc({ result: 'no_renewed_token' });
      if (typeof rec.tokenHeadersDropped === 'number') reflected.inc(rec.tokenHeadersDropped);
    },
    answering(res: ServerResponse, contentType: string | string[] | undefined): void {
      const type = Array.isArray(contentType) ? contentType[0] : contentType;
      if (!type?.toLowerCase().startsWith('text/event-stream')) return;
      const labels = { http_route: routeOf(res.req.url) };
      streams.inc(labels);
      res.once('close', () => streams.dec(labels));
    },
    configLoaded(ok: boolean, count: number): void {
      reloads.inc({ file: configFile, result: ok ? 'ok' : 'rejected' });
      lastOk.set({ file: configFile }, ok ? 1 : 0);
      if (ok) {
        lastOkTime.set({ file: configFile }, Date.now() / 1000);
        entries.set({ file: configFile }, count);
      }
    },
  };
}
