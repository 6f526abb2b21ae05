// Kept for forwarder-process.test.ts, not yet moved to test/support (see issue item 5).
export { json, MockGateway, sse, type GatewayHandler, type SeenRequest } from '../../test/support/mock-gateway.js';
