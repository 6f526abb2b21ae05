import type tap from 'tap';

/** The subtest type tap hands to callbacks (tap exports it only through overloads). */
export type TapTest = Parameters<Parameters<typeof tap.test>[0]>[0];
