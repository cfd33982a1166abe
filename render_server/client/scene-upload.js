// Uploading a designer's model (POST /api/scenes, docs/scenes.md): the file goes as the raw
// body with its media type, streamed by the browser, with progress; the answer is the stored
// scene's id and the ticket its worker needs to load it (the loadScene command).

/** What the server takes, by file name. A glTF with separate buffers or textures goes zipped. */
export const MODEL_TYPES = {
  '.glb': 'model/gltf-binary',
  '.gltf': 'model/gltf+json',
  '.obj': 'model/obj',
  '.zip': 'application/zip',
};
export const MODEL_ACCEPT = Object.keys(MODEL_TYPES).join(',');

/** The media type of `file` by its name; null for a file the server would not take. */
export function modelType(file) {
  const name = (file && file.name || '').toLowerCase();
  const suffix = Object.keys(MODEL_TYPES).find((s) => name.endsWith(s));
  return suffix ? MODEL_TYPES[suffix] : null;
}

/** An upload refused or failed, with the server's code (or `bad_file`, `network`, `aborted`). */
export class UploadError extends Error {
  constructor(code, message, status = 0) {
    super(message);
    this.name = 'UploadError';
    this.code = code;
    this.status = status;
  }
}

/**
 * Uploads `file` to `server` (an origin) with `token` (where the server asks for one); resolves
 * with `{id, name, kind, bytes, ticket}`. `onProgress(fraction)` follows the bytes sent.
 * XMLHttpRequest rather than fetch: only it reports an upload's progress in every browser.
 */
export function uploadScene(server, token, file, { onProgress = null, signal = null } = {}) {
  const type = modelType(file);
  if (!type) {
    return Promise.reject(new UploadError('bad_file',
      `${file && file.name || 'this file'} is not a model the server takes: .glb, .gltf, .obj, or a .zip of a .gltf or .obj with its files`));
  }
  return new Promise((resolve, reject) => {
    const request = new XMLHttpRequest();
    const url = new URL('/api/scenes', server);
    url.searchParams.set('name', file.name.slice(0, 200));
    request.open('POST', url.href);
    request.setRequestHeader('Content-Type', type);
    if (token) request.setRequestHeader('Authorization', `Bearer ${token}`);
    request.responseType = 'text';
    if (onProgress) {
      request.upload.onprogress = (event) => {
        if (event.lengthComputable && event.total) onProgress(event.loaded / event.total);
      };
    }
    request.onload = () => {
      let body = null;
      try { body = JSON.parse(request.responseText); } catch { /* not JSON: said below */ }
      if (request.status === 201 && body && body.id && body.ticket) {
        resolve(body);
        return;
      }
      const error = body && body.error;
      reject(new UploadError(error?.code || 'upload_failed',
        error?.message || `the server answered ${request.status}`, request.status));
    };
    request.onerror = () => reject(new UploadError('network', 'the upload did not reach the server'));
    request.onabort = () => reject(new UploadError('aborted', 'the upload was cancelled'));
    signal?.addEventListener('abort', () => request.abort(), { once: true });
    request.send(file);
  });
}
