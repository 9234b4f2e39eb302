"""Compiled (numba) kernel of :func:`funnel_core.cluster.knn_block`; imported only when used.

Per document (term-at-a-time, one dense float64 accumulator per thread): its top-``m`` terms
(ties: lower column) form the query; terms are opened in decreasing order of their largest
weight, and once the bound on what the unopened terms can add to an untouched document is below
both ``threshold * self-score`` and the k-th best partial score, no new documents are opened and
the remaining terms only complete the touched documents' scores. The pruning is exact: a
document it never touches cannot score at or above the threshold, nor among the top ``k``.
Scores are float64 sums of float32 weights, so they equal the plain sparse product's.
"""

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def knn_rows_kernel(indptr, indices, data, cptr, crow, cval, ub, start, stop, offset, n, k, thr, m,
                    prune, out_cols, out_vals, out_cnt):
    acc = np.zeros(n, np.float64)
    mark = np.zeros(n, np.bool_)
    touched = np.empty(n, np.int64)
    cand_j = np.empty(n, np.int64)
    cand_v = np.empty(n, np.float64)
    for i in range(start, stop):
        r = i - offset
        out_cnt[r] = 0
        lo, hi = indptr[i], indptr[i + 1]
        if hi == lo:
            continue
        row_w = data[lo:hi]
        top = np.argsort(-row_w, kind="mergesort")[:m]  # stable: ties -> lower column
        nt = len(top)
        terms = np.empty(nt, np.int64)
        self_s = 0.0
        for a in range(nt):
            terms[a] = indices[lo + top[a]]
            self_s += np.float64(row_w[top[a]])
        if self_s <= 0:
            continue
        # process rare / high-bound terms first; suffix[p] bounds what terms p.. can add
        tub = np.empty(nt, np.float64)
        for a in range(nt):
            tub[a] = ub[terms[a]]
        porder = np.argsort(-tub, kind="mergesort")
        suffix = np.zeros(nt + 1, np.float64)
        for a in range(nt - 1, -1, -1):
            suffix[a] = suffix[a + 1] + tub[porder[a]]
        floor = thr * self_s
        ntouched = 0
        best = 0.0  # highest partial score of a document other than i
        p = 0
        while p < nt:
            if prune:
                U = suffix[p]
                # an untouched document scores at most U: if that cannot reach the threshold
                # or beat k documents already above it, stop opening new documents.
                if U < floor:
                    break
                if U < best and ntouched > k:
                    vals = np.empty(ntouched, np.float64)
                    for a in range(ntouched):
                        j = touched[a]
                        vals[a] = acc[j] if j != i else -1.0
                    kth = np.partition(vals, ntouched - k)[ntouched - k]
                    if U < kth:
                        break
            t = terms[porder[p]]
            for q in range(cptr[t], cptr[t + 1]):
                j = crow[q]
                if not mark[j]:
                    mark[j] = True
                    touched[ntouched] = j
                    ntouched += 1
                acc[j] += np.float64(cval[q])
                if j != i and acc[j] > best:
                    best = acc[j]
            p += 1
        # remaining terms: complete the scores of the touched documents only
        for pp in range(p, nt):
            t = terms[porder[pp]]
            df = cptr[t + 1] - cptr[t]
            if df <= 8 * ntouched:
                for q in range(cptr[t], cptr[t + 1]):
                    j = crow[q]
                    if mark[j]:
                        acc[j] += np.float64(cval[q])
            else:
                for a in range(ntouched):
                    j = touched[a]
                    jl, jh = indptr[j], indptr[j + 1]
                    pos = jl + np.searchsorted(indices[jl:jh], t)
                    if pos < jh and indices[pos] == t:
                        acc[j] += np.float64(data[pos])
        cnt = 0
        for a in range(ntouched):
            j = touched[a]
            s = acc[j]
            if j != i and s != 0.0:
                v = s / self_s
                if v >= thr:
                    cand_j[cnt] = j
                    cand_v[cnt] = v
                    cnt += 1
            acc[j] = 0.0
            mark[j] = False
        if cnt > 0:
            cj = cand_j[:cnt]
            cv = cand_v[:cnt]
            o1 = np.argsort(cj)
            cj = cj[o1]
            cv = cv[o1]
            o2 = np.argsort(-cv, kind="mergesort")  # by score, ties -> lower index
            kk = min(k, cnt)
            for a in range(kk):
                out_cols[r, a] = cj[o2[a]]
                out_vals[r, a] = min(cv[o2[a]], 1.0)
            out_cnt[r] = kk

@numba.njit(cache=True, parallel=True)
def knn_block_kernel(indptr, indices, data, cptr, crow, cval, ub, start, stop, n, k, thr, m, prune,
                 nparts, out_cols, out_vals, out_cnt):
    B = stop - start
    step = (B + nparts - 1) // nparts
    for t in numba.prange(nparts):
        s = start + t * step
        e = min(stop, s + step)
        if s < e:
            knn_rows_kernel(indptr, indices, data, cptr, crow, cval, ub, s, e, start, n, k, thr, m,
                        prune, out_cols, out_vals, out_cnt)
