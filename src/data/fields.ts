import { isAbsolute } from 'node:path';
import { z } from 'zod';
import { isLoopbackHostname } from '../net/loopback-address.js';

/** Field schemas shared by more than one format (registry, catalog, the Gateway URL). */

/** https anywhere; plain http only to loopback (tests, dev, a local gateway). */
export const upstreamUrlSchema = z.string().superRefine((value, ctx) => {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    ctx.addIssue({ code: 'custom', message: 'upstreamUrl is not a valid URL' });
    return;
  }
  if (url.username || url.password) {
    ctx.addIssue({ code: 'custom', message: 'upstreamUrl must not carry credentials' });
  } else if (url.protocol === 'https:') {
    return;
  } else if (url.protocol === 'http:') {
    if (!isLoopbackHostname(url.hostname)) {
      ctx.addIssue({ code: 'custom', message: 'upstreamUrl may use http: only for a loopback host' });
    }
  } else {
    ctx.addIssue({ code: 'custom', message: 'upstreamUrl must be https: (or http: to loopback)' });
  }
});

export const absolutePathSchema = z
  .string()
  .min(1)
  .refine((p) => isAbsolute(p), 'must be an absolute path');
