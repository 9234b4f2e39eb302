"""Compiled (numba) batch search of :class:`funnel_core.bm25.BM25Index` (``engine="numba"``);
imported only when used.

One query at a time per thread, term at a time into a float32 accumulator: every posting of every
query term, in the query's token order (a repeated token counts again), is added to its document's
score, exactly the float32 sums ``bm25s.BM25.get_scores_from_ids`` computes with ``np.add.at``, so
both engines rank identically. The touched documents with a positive score (and allowed by the
filter mask) are candidates; the ``k`` best (score descending, ties: lower index) are kept in a
size-``k`` heap whose root is the worst kept (lowest score, then highest index), in one pass. The kernel runs a contiguous range of queries with its own
accumulator, reset only where touched; it releases the GIL (``nogil``), so the caller runs one
range per Python thread (numba's own parallel layer is avoided: its default ``workqueue`` layer
aborts when two threads launch parallel kernels at once, as a threaded web server or LangChain's
``batch`` would). ``cache=True``: compiled once per installation, not per process.
"""

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def dense_scores(indptr, indices, data, ids, n):
    """Every document's score for one query's term ids (float32, token order, as bm25s sums)."""
    acc = np.zeros(n, np.float32)
    for t in ids:
        for p in range(indptr[t], indptr[t + 1]):
            acc[indices[p]] += data[p]
    return acc


@numba.njit(cache=True, nogil=True, inline="always")
def _worse(va, ia, vb, ib):
    """Is (score va, index ia) ranked below (vb, ib)? Lower score, or equal score and higher index."""
    return va < vb or (va == vb and ia > ib)


@numba.njit(cache=True, nogil=True)
def _sift_down(hv, hi, pos, length):
    """Restore the heap below ``pos`` (root = the worst kept hit)."""
    v, i = hv[pos], hi[pos]
    while True:
        c = 2 * pos + 1
        if c >= length:
            break
        if c + 1 < length and _worse(hv[c + 1], hi[c + 1], hv[c], hi[c]):
            c += 1
        if not _worse(hv[c], hi[c], v, i):
            break
        hv[pos], hi[pos] = hv[c], hi[c]
        pos = c
    hv[pos], hi[pos] = v, i


@numba.njit(cache=True, nogil=True)
def _offer(hv, hi, length, k, v, d):
    """Offer candidate (v, d) to the heap holding ``length`` hits; returns the new length."""
    if length < k:
        pos = length  # sift up
        while pos > 0:
            parent = (pos - 1) >> 1
            if not _worse(v, d, hv[parent], hi[parent]):
                break
            hv[pos], hi[pos] = hv[parent], hi[parent]
            pos = parent
        hv[pos], hi[pos] = v, d
        return length + 1
    if _worse(hv[0], hi[0], v, d):  # better than the worst kept: replace the root
        hv[0], hi[0] = v, d
        _sift_down(hv, hi, 0, length)
    return length


@numba.njit(cache=True, nogil=True)
def search_range(indptr, indices, data, q_ptr, q_ids, mask, use_mask, n, k, lo, hi,
                 out_idx, out_val, out_cnt):
    acc = np.zeros(n, np.float32)
    mark = np.zeros(n, np.bool_)
    touched = np.empty(n, np.int64)
    hv = np.empty(k, np.float32)
    hx = np.empty(k, np.int64)
    for qi in range(lo, hi):
        postings = 0
        for a in range(q_ptr[qi], q_ptr[qi + 1]):
            postings += indptr[q_ids[a] + 1] - indptr[q_ids[a]]
        length = 0
        if postings * 8 < n:  # few documents touched: remember which, visit only those
            ntouched = 0
            for a in range(q_ptr[qi], q_ptr[qi + 1]):
                t = q_ids[a]
                for p in range(indptr[t], indptr[t + 1]):
                    d = indices[p]
                    if not mark[d]:
                        mark[d] = True
                        touched[ntouched] = d
                        ntouched += 1
                    acc[d] += data[p]
            for a in range(ntouched):
                d = touched[a]
                s = acc[d]
                if s > 0 and (not use_mask or mask[d]):
                    length = _offer(hv, hx, length, k, s, d)
                acc[d] = 0
                mark[d] = False
        else:  # many: one sequential pass over all documents (cheaper than scattered visits)
            for a in range(q_ptr[qi], q_ptr[qi + 1]):
                t = q_ids[a]
                for p in range(indptr[t], indptr[t + 1]):
                    acc[indices[p]] += data[p]
            for d in range(n):
                s = acc[d]
                if s > 0:
                    if (length < k or s >= hv[0]) and (not use_mask or mask[d]):
                        length = _offer(hv, hx, length, k, s, d)
                    acc[d] = 0
        # best first: score descending, index ascending (stable sorts: by index, then by -score)
        o = np.argsort(hx[:length], kind="mergesort")
        js = hx[:length][o]
        vs = hv[:length][o]
        o2 = np.argsort(-vs, kind="mergesort")
        for a in range(length):
            out_idx[qi, a] = js[o2[a]]
            out_val[qi, a] = vs[o2[a]]
        out_cnt[qi] = length
