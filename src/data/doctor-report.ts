import { z } from 'zod';
import { rfc3339Schema } from './renew-wire.js';

/**
 * `agent-connectors doctor --json` (one document on stdout). Field names are stable: a
 * field may be added, none renamed or removed without a new `format`. Problem codes are
 * snake_case and shared with presence where the same fact is meant (data/problem-codes.ts);
 * every check that is not ok has one. No secret: details name files, slots, binding ids
 * by their prefix, versions and times, never a token or the host credential.
 */

export const DOCTOR_REPORT_FORMAT = 'agent-connectors.doctor/1';

export const checkStatusSchema = z.enum(['ok', 'warn', 'problem']);
export type CheckStatus = z.infer<typeof checkStatusSchema>;

const problemCodeSchema = z.string().regex(/^[a-z][a-z0-9_]{0,63}$/);

export const doctorCheckSchema = z.strictObject({
  /** The area: users, directories, registry, catalog, tokens, credential, agent user, renewal, ports, units, enrolment, link, desired state, drift, audit. */
  check: z.string().min(1),
  status: checkStatusSchema,
  /** Present on every warn and problem. */
  code: problemCodeSchema.optional(),
  detail: z.string(),
  /** The command that fixes it. */
  fix: z.string().optional(),
});

export type DoctorCheck = z.infer<typeof doctorCheckSchema>;

export const doctorReportSchema = z.strictObject({
  format: z.literal(DOCTOR_REPORT_FORMAT),
  /** The agent-connectors version that wrote the report. */
  version: z.string(),
  generatedAt: rfc3339Schema,
  enrolment: z.strictObject({
    enrolled: z.boolean(),
    gatewayUrl: z.string().optional(),
    hostId: z.string().optional(),
  }),
  checks: z.array(doctorCheckSchema),
  summary: z.strictObject({
    ok: z.number().int().min(0),
    warn: z.number().int().min(0),
    problem: z.number().int().min(0),
    /** The distinct codes of the problems, sorted (warnings not included). */
    problems: z.array(problemCodeSchema),
    /** The distinct codes of the warnings, sorted. */
    warnings: z.array(problemCodeSchema),
    /** The exit code: 1 when there is any problem. */
    exitCode: z.union([z.literal(0), z.literal(1)]),
  }),
});

export type DoctorReport = z.infer<typeof doctorReportSchema>;
