import { stat } from 'node:fs/promises';
import { execa } from 'execa';
import { request } from 'undici';
import type { PartHealth } from '../data/problem-codes.js';

/**
 * How doctor and status look at the running parts. A part's health follows the rule
 * presence uses (link/presence.ts), so doctor's `forwarder_down` is presence's: 200 with
 * `status: ok` → ok, any other answer → degraded, no answer within 2 s → down.
 */
export async function probeHealth(baseUrl: string): Promise<{ health: PartHealth; said?: string }> {
  try {
    const res = await request(`${baseUrl}/healthz`, { headersTimeout: 2000, bodyTimeout: 2000 });
    const text = await res.body.text();
    let status: unknown;
    try {
      status = (JSON.parse(text) as { status?: unknown } | null)?.status;
    } catch {
      status = undefined;
    }
    if (res.statusCode === 200 && status === 'ok') return { health: 'ok' };
    return { health: 'degraded', said: typeof status === 'string' ? status.slice(0, 40) : `status ${res.statusCode}` };
  } catch {
    return { health: 'down' };
  }
}

/** Whether systemd is the init system here (sd_booted). */
export async function systemdRunning(): Promise<boolean> {
  return (await stat('/run/systemd/system').catch(() => undefined)) !== undefined;
}

/** `systemctl is-active UNIT`: its word (active, inactive, failed, …) and exit code. */
export async function unitState(unit: string): Promise<{ state: string; exitCode: number }> {
  const r = await execa('systemctl', ['is-active', unit], { reject: false, timeout: 10_000 });
  return { state: String(r.stdout ?? '').trim() || 'unknown', exitCode: r.exitCode ?? 1 };
}
