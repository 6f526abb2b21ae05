// Kept for the renew, systemd and forwarder-process tests, not yet moved to test/support.
export type { TapTest } from '../../test/support/tap.js';
