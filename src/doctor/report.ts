import { DOCTOR_REPORT_FORMAT, doctorReportSchema, type DoctorReport } from '../data/doctor-report.js';
import type { Finding } from './finding.js';
import type { Enrolment } from './link-checks.js';

const codesOf = (findings: Finding[], level: Finding['level']): string[] =>
  [...new Set(findings.filter((f) => f.level === level).flatMap((f) => f.code ?? []))].sort();

/** The `doctor --json` document, validated against its schema before anyone sees it. */
export function doctorReport(findings: Finding[], enrolment: Enrolment, version: string, now: number): DoctorReport {
  const count = (level: Finding['level']): number => findings.filter((f) => f.level === level).length;
  const problem = count('problem');
  return doctorReportSchema.parse({
    format: DOCTOR_REPORT_FORMAT,
    version,
    generatedAt: new Date(now).toISOString(),
    enrolment,
    checks: findings.map((f) => ({ check: f.check, status: f.level, ...(f.code ? { code: f.code } : {}), detail: f.detail, ...(f.fix ? { fix: f.fix } : {}) })),
    summary: { ok: count('ok'), warn: count('warn'), problem, problems: codesOf(findings, 'problem'), warnings: codesOf(findings, 'warn'), exitCode: problem ? 1 : 0 },
  });
}
