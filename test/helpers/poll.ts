// Kept for test/renew and test/service, not yet moved to test/support (see issue item 5).
export { eventually, until } from '../support/poll.js';
