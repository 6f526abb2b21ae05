import t from 'tap';
import { LAB_QUEUE_ALLOWANCE_MS } from '../test/support/lab.js';
import { prepareLabPackages } from './helpers/lab-debs.js';
// Each scenario registers its top-level test on import; tap runs them one after the other.
import './labs/installed-units.js';
import './labs/host-link.js';
import './labs/deb.js';
import './labs/deb-bookworm.js';

/**
 * The systemd lab scenarios (docs/testing.md) in one test file. Every lab serves the units'
 * fixed ports, so only one runs at a time on a machine (test/support/lab.ts takes a lock);
 * as separate files, two of them would each hold one of tap's parallel jobs while one
 * waited for the other. Here they run in turn and leave the other jobs to the rest.
 *
 * The name sorts first: tap starts files in name order, and this one is the suite's
 * longest (minutes), so begun first it runs beside the others instead of after them
 * (test/suite-order.test.ts holds that).
 */
// Whatever the scenarios asked for, the file as a whole: their budgets plus a queue for the lock.
t.setTimeout(100 * 60_000 + LAB_QUEUE_ALLOWANCE_MS);
// The packages and roots of the last two scenarios are built while the first two run.
prepareLabPackages();
