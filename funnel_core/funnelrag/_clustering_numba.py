"""Compiled (numba) kernel of :func:`funnel_core.funnelrag.clustering.knn_block`; imported only when used.

Per document, term at a time into a float64 accumulator per thread (no (rows x n) score block is
materialised): its top-``m`` terms (ties: lower column) form the query; every posting of every
query term is added to the documents' scores; the documents at or above ``threshold *
self-score`` are candidates and the ``k`` best (ties: lower index) are selected in O(candidates).
Scores are float64 sums of float32 weights, so they equal the plain sparse product's whatever
the summation order.

The work is the summed posting length of the query terms, exact and unpruned; what it costs is
the scattered adds into the accumulator. The documents are therefore walked in tiles of ``tile``
documents (:func:`funnel_core.funnelrag.clustering.knn_tile`: a quarter of the L2 cache): the
accumulator holds one tile and each query term's posting list, sorted by document, is consumed
tile by tile through a cursor. After a tile's adds, its postings are walked once more: each
document's score is read, tested against the threshold (a branch that is rarely taken: on the
1M-document benchmark corpus ~2% of the postings end in a candidate) and zeroed, so a document
reached by several terms is tested once and no list of touched documents is kept.

Measured on the 1M-document synthetic corpus (2 threads, AMD EPYC, 512 KiB L2 per core; throwaway
scripts): this ran in 0.67-0.71x the time of the previous kernel (a 4,096-document tile with a
touched list and a mark per document), which itself ran in 0.25-0.32x the time of one
accumulator over all documents. Tried with 4,096-document tiles on one thread and slower than
the previous kernel: re-walking to extract with branch-free stores, and per-(term, tile) posting
offsets computed in advance; no faster: recording each document when its score first crosses
the threshold. Slower in earlier rounds: a bitmap instead of the touched list, and score-bound
(MaxScore) pruning, whose bound kept ~60% of the touched documents.
"""

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def knn_rows_kernel(indptr, indices, data, cptr, crow, cval, start, stop, offset, n, k, thr, m,
                    tile, out_cols, out_vals, out_cnt):
    acc = np.zeros(tile, np.float64)
    cand_j = np.empty(n, np.int64)
    cand_v = np.empty(n, np.float64)
    eq_j = np.empty(n, np.int64)
    sel_j = np.empty(k, np.int64)
    sel_v = np.empty(k, np.float64)
    cursor = np.empty(m, np.int64)
    first = np.empty(m, np.int64)
    last = np.empty(m, np.int64)
    for i in range(start, stop):
        r = i - offset
        out_cnt[r] = 0
        lo, hi = indptr[i], indptr[i + 1]
        if hi == lo:
            continue
        row_w = data[lo:hi]
        top = np.argsort(-row_w, kind="mergesort")[:m]  # stable: ties -> lower column
        nt = len(top)
        self_s = 0.0
        for a in range(nt):
            t = indices[lo + top[a]]
            cursor[a] = cptr[t]
            last[a] = cptr[t + 1]
            self_s += np.float64(row_w[top[a]])
        if self_s <= 0:
            continue
        # a cheap pre-test below the exact one (s / self_s >= thr); > 0 so that zeroed and
        # non-positive scores never pass, as the exact test with s != 0 requires
        bound = max(thr * self_s * (1.0 - 1e-9), 5e-324)
        cnt = 0
        for t0 in range(0, n, tile):  # one tile of documents at a time: acc stays in cache
            t1 = t0 + tile
            for a in range(nt):
                q = cursor[a]
                e = last[a]
                first[a] = q
                while q < e:  # postings are in document order: this term's run in the tile
                    j = crow[q]
                    if j >= t1:
                        break
                    acc[j - t0] += np.float64(cval[q])
                    q += 1
                cursor[a] = q
            for a in range(nt):  # the same postings again: test each document once, zero it
                for q in range(first[a], cursor[a]):
                    j = crow[q]
                    s = acc[j - t0]
                    if s >= bound:
                        v = s / self_s
                        if j != i and v >= thr:
                            cand_j[cnt] = j
                            cand_v[cnt] = v
                            cnt += 1
                    acc[j - t0] = 0.0
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
                     tile, nparts, out_cols, out_vals, out_cnt):
    B = stop - start
    step = (B + nparts - 1) // nparts
    for t in numba.prange(nparts):
        s = start + t * step
        e = min(stop, s + step)
        if s < e:
            knn_rows_kernel(indptr, indices, data, cptr, crow, cval, s, e, start, n, k, thr, m,
                            tile, out_cols, out_vals, out_cnt)


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


@numba.njit(cache=True, nogil=True)
def algorithm1_kernel(indptr, indices, weights, order, sizes, max_tokens, grow_absorbed):
    """Steps 2-3 of Algorithm 1 (see ``clustering._merge_python``, the same steps in Python).

    Clusters are linked lists of documents (``head``/``nxt``), so a merge appends a list in
    O(1) and keeps the merge order; a new cluster gets the next id (n, n+1, ...). A neighbour
    cluster's strength is the sum of the edge weights in ``d``'s row order (as ``np.bincount``
    sums them), its closeness strength / member count; ranked by closeness, ties by lower id.
    Returns ``(head, nxt, alive)``.
    """
    n = len(sizes)
    cap = 2 * n + 1
    cluster_of = np.arange(n)
    head = np.full(cap, -1, np.int64)
    tail = np.full(cap, -1, np.int64)
    nxt = np.full(n, -1, np.int64)
    count = np.zeros(cap, np.int64)
    tokens = np.zeros(cap, np.int64)
    alive = np.zeros(cap, np.bool_)
    for i in range(n):
        head[i] = i
        tail[i] = i
        count[i] = 1
        tokens[i] = sizes[i]
        alive[i] = True
    strength = np.zeros(cap, np.float64)
    seen = np.zeros(cap, np.bool_)
    found = np.empty(n, np.int64)
    next_id = n
    for d in order:
        cid = cluster_of[d]
        if count[cid] > 1 and not grow_absorbed:
            continue  # already absorbed by a more central document
        nfound = 0
        for p in range(indptr[d], indptr[d + 1]):
            c = cluster_of[indices[p]]
            if c == cid:
                continue
            if not seen[c]:
                seen[c] = True
                found[nfound] = c
                nfound += 1
            strength[c] += weights[p]
        if nfound == 0:
            continue
        near = np.sort(found[:nfound])
        closeness = np.empty(nfound, np.float64)
        for a in range(nfound):
            c = near[a]
            closeness[a] = strength[c] / count[c]
            strength[c] = 0.0
            seen[c] = False
        ranked = near[np.argsort(-closeness, kind="mergesort")]  # stable: ties -> lower id
        new = next_id
        next_id += 1
        head[new] = head[cid]
        tail[new] = tail[cid]
        count[new] = count[cid]
        size = tokens[cid]
        alive[cid] = False
        for c in ranked:
            if size + tokens[c] > max_tokens:
                continue
            nxt[tail[new]] = head[c]
            tail[new] = tail[c]
            count[new] += count[c]
            size += tokens[c]
            alive[c] = False
        tokens[new] = size
        alive[new] = True
        x = head[new]
        while x != -1:
            cluster_of[x] = new
            x = nxt[x]
    return head, nxt, alive


@numba.njit(cache=True, nogil=True)
def cluster_lists(head, nxt, live):
    """The members of each ``live`` cluster, flattened in list order: ``(flat, offsets, lowest)``
    with cluster ``c``'s members ``flat[offsets[c]:offsets[c + 1]]`` and its lowest member."""
    flat = np.empty(len(nxt), np.int64)
    offsets = np.zeros(len(live) + 1, np.int64)
    lowest = np.empty(len(live), np.int64)
    p = 0
    for c in range(len(live)):
        x = head[live[c]]
        low = x
        while x != -1:
            flat[p] = x
            p += 1
            if x < low:
                low = x
            x = nxt[x]
        offsets[c + 1] = p
        lowest[c] = low
    return flat[:p], offsets, lowest
