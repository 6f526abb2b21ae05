import { isAbsolute } from 'node:path';
import { z } from 'zod';
import { isLoopbackHostname } from '../http/loopback.js';
import { parseJsonWith, type ParseResult } from '../config/parse-json.js';

export const BINDING_ID = /^[A-Za-z0-9_-]{8,128}$/;

export const bindingIdSchema = z.string().regex(BINDING_ID, 'bindingId must match [A-Za-z0-9_-]{8,128}');

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

export const bindingSchema = z.strictObject({
  instanceId: z.string().regex(/^[A-Za-z0-9_.-]{1,128}$/, 'instanceId must match [A-Za-z0-9_.-]{1,128}'),
  upstreamUrl: upstreamUrlSchema,
  tokenFile: absolutePathSchema,
});

export const instancesFileSchema = z.record(bindingIdSchema, bindingSchema);

export type Binding = z.infer<typeof bindingSchema>;
export type InstancesFile = z.infer<typeof instancesFileSchema>;

/** A short, non-secret prefix of a binding id, safe for logs. */
export function bindingPrefix(bindingId: string): string {
  return `${bindingId.slice(0, 4)}…`;
}

export type { ParseResult } from '../config/parse-json.js';

/**
 * zod's own messages may quote the offending text (an unknown key's name, say); ours are
 * built from the issue code, so no file content reaches a log or /healthz.
 */
function issueMessage(issue: z.core.$ZodIssue): string {
  switch (issue.code) {
    case 'unrecognized_keys':
      return `${issue.keys.length} unknown propert${issue.keys.length === 1 ? 'y' : 'ies'}`;
    case 'invalid_key':
      return 'invalid binding id (must match [A-Za-z0-9_-]{8,128})';
    case 'invalid_type':
      return `expected ${issue.expected}`;
    case 'custom':
    case 'invalid_format':
    case 'too_small':
    case 'too_big':
      return issue.message;
    default:
      return 'invalid value';
  }
}

/** Formats zod issues without echoing values (a value could be a secret pasted by mistake). */
export function describeIssues(error: z.ZodError): string {
  return error.issues
    .slice(0, 5)
    .map((i) => {
      // Record keys are binding ids (capabilities): show only their prefix.
      const path = i.path.map((p, idx) => (idx === 0 && typeof p === 'string' ? bindingPrefix(p) : String(p))).join('.');
      return `${path || '(root)'}: ${issueMessage(i)}`;
    })
    .join('; ');
}

export function parseInstancesFile(text: string): ParseResult<InstancesFile> {
  return parseJsonWith(instancesFileSchema, text);
}
