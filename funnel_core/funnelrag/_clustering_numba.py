"""Compiled (numba) kernel of :func:`funnel_core.funnelrag.clustering.knn_block`; imported only when used.

Per document, term at a time into one dense float64 accumulator per thread (no (rows x n) score
block is materialised): its top-``m`` terms (ties: lower column) form the query; every posting of
every query term is added to the documents' scores; the touched documents at or above
``threshold * self-score`` are candidates and the ``k`` best (ties: lower index) are selected in
O(candidates). Scores are float64 sums of float32 weights, so they equal the plain sparse
product's whatever the summation order.

The work is the summed posting length of the query terms, exact and unpruned. (Score-bound
pruning with each term's largest weight, MaxScore-style, was tried: on the synthetic benchmark
corpus the bound was too loose, it kept ~60% of the touched documents and was slower.)
"""

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def knn_rows_kernel(indptr, indices, data, cptr, crow, cval, start, stop, offset, n, k, thr, m,
                    out_cols, out_vals, out_cnt):
    acc = np.zeros(n, np.float64)
    mark = np.zeros(n, np.bool_)
    touched = np.empty(n, np.int64)
    cand_j = np.empty(n, np.int64)
    cand_v = np.empty(n, np.float64)
    eq_j = np.empty(n, np.int64)
    sel_j = np.empty(k, np.int64)
    sel_v = np.empty(k, np.float64)
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
        ntouched = 0
        for a in range(nt):
            t = terms[a]
            for q in range(cptr[t], cptr[t + 1]):
                j = crow[q]
                if not mark[j]:
                    mark[j] = True
                    touched[ntouched] = j
                    ntouched += 1
                acc[j] += np.float64(cval[q])
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
        if cnt == 0:
            continue
        kk = min(k, cnt)
        if cnt > k:
            # k-th best score in O(cnt); keep those above it and the lowest-index ties
            kth = np.partition(cand_v[:cnt], cnt - k)[cnt - k]
            ngt = 0
            neq = 0
            for a in range(cnt):
                if cand_v[a] > kth:
                    sel_j[ngt] = cand_j[a]
                    sel_v[ngt] = cand_v[a]
                    ngt += 1
                elif cand_v[a] == kth:
                    eq_j[neq] = cand_j[a]
                    neq += 1
            ties = np.sort(eq_j[:neq])
            for a in range(k - ngt):
                sel_j[ngt + a] = ties[a]
                sel_v[ngt + a] = kth
        else:
            for a in range(cnt):
                sel_j[a] = cand_j[a]
                sel_v[a] = cand_v[a]
        o = np.argsort(sel_j[:kk])  # columns in increasing order
        for a in range(kk):
            out_cols[r, a] = sel_j[o[a]]
            out_vals[r, a] = min(sel_v[o[a]], 1.0)
        out_cnt[r] = kk


@numba.njit(cache=True, parallel=True)
def knn_block_kernel(indptr, indices, data, cptr, crow, cval, start, stop, n, k, thr, m,
                     nparts, out_cols, out_vals, out_cnt):
    B = stop - start
    step = (B + nparts - 1) // nparts
    for t in numba.prange(nparts):
        s = start + t * step
        e = min(stop, s + step)
        if s < e:
            knn_rows_kernel(indptr, indices, data, cptr, crow, cval, s, e, start, n, k, thr, m,
                            out_cols, out_vals, out_cnt)


@numba.njit(cache=True, nogil=True)
def triangles_kernel(indptr, indices, n):
    """Triangles through every node of a symmetric graph without self-loops (CSR pattern).

    Each edge is oriented from the lower to the higher (degree, index) node, so every triangle
    is found once, from its lowest node, and hubs are never scanned from below (O(m^1.5)).
    """
    deg = indptr[1:] - indptr[:-1]
    out_ptr = np.zeros(n + 1, np.int64)
    for v in range(n):
        c = 0
        for a in range(indptr[v], indptr[v + 1]):
            u = indices[a]
            if deg[u] > deg[v] or (deg[u] == deg[v] and u > v):
                c += 1
        out_ptr[v + 1] = out_ptr[v] + c
    out = np.empty(out_ptr[n], np.int64)
    for v in range(n):
        p = out_ptr[v]
        for a in range(indptr[v], indptr[v + 1]):
            u = indices[a]
            if deg[u] > deg[v] or (deg[u] == deg[v] and u > v):
                out[p] = u
                p += 1
    tri = np.zeros(n, np.float64)
    mark = np.zeros(n, np.bool_)
    for v in range(n):
        for a in range(out_ptr[v], out_ptr[v + 1]):
            mark[out[a]] = True
        for a in range(out_ptr[v], out_ptr[v + 1]):
            u = out[a]
            for b in range(out_ptr[u], out_ptr[u + 1]):
                w = out[b]
                if mark[w]:
                    tri[v] += 1.0
                    tri[u] += 1.0
                    tri[w] += 1.0
        for a in range(out_ptr[v], out_ptr[v + 1]):
            mark[out[a]] = False
    return tri
