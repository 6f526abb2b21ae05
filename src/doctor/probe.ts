import { stat } from 'node:fs/promises';
import type { PartHealth } from '../data/problem-codes.js';
import { probePartHealth } from '../http/health-probe.js';

/**
 * How doctor and status look at the running parts: by presence's rule
 * (http/health-probe.ts), so doctor's `forwarder_down` is presence's. No answer, or none
 * complete and within its bound in 2 s → down.
 */
export async function probeHealth(baseUrl: string): Promise<{ health: PartHealth; said?: string }> {
  return probePartHealth(`${baseUrl}/healthz`, { timeoutMs: 2000 });
}

/** Whether systemd is the init system here (sd_booted). */
export async function systemdRunning(): Promise<boolean> {
  return (await stat('/run/systemd/system').catch(() => undefined)) !== undefined;
}

/** `systemctl is-active UNIT`: its word (active, inactive, failed, …) and exit code. */
export async function unitState(unit: string): Promise<{ state: string; exitCode: number }> {
  // Loaded when used: doctor --no-systemd and status never run systemctl (docs/performance.md).
  const { execa } = await import('execa');
  const r = await execa('systemctl', ['is-active', unit], { reject: false, timeout: 10_000 });
  return { state: String(r.stdout ?? '').trim() || 'unknown', exitCode: r.exitCode ?? 1 };
}
