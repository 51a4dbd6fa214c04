import pandas as pd,glob,numpy as np,sys
root=sys.argv[1]
pts=pd.concat([pd.read_parquet(f) for f in glob.glob(f'{root}/points/*.parquet')])
for f in sorted(glob.glob(f'{root}/traces/*.parquet')):
    t=pd.read_parquet(f); key=t.key.iloc[0]
    row=pts[pts.key==key].iloc[0]
    b=t[t.role=='BUILD']; t0=t.t0_ns.min(); T=t.t1_ns.max()
    d=(b.t1_ns-b.t0_ns)/1e3
    print(row.M,row.N,row.K, f"span {(T-t0)/1e3:.0f} t_med {row.t_median_us:.0f} gemm {row.t_gemm_us:.0f} copy {row.t_comm_us:.0f}", "tile q10/50/90", np.round(np.quantile(d,[0.1,0.5,0.9]),1), "n",len(b))
    edges=np.linspace(t0,T,21)
    busy=[]
    for a,c in zip(edges[:-1],edges[1:]):
        ov=(np.minimum(b.t1_ns,c)-np.maximum(b.t0_ns,a)).clip(lower=0).sum()
        busy.append(ov/((c-a)*132))
    print('   busy/20', ' '.join(f'{x:.2f}' for x in busy))
    # last 400us: tile starts/ends
    last=b[b.t1_ns>T-400e3]
    print('   tiles ending in last 400us', len(last), 'last tile starts (us before end):', np.round(np.sort((T-b.t0_ns.values)/1e3)[:5],0), 'dur of last-started', np.round(((b.t1_ns-b.t0_ns)/1e3).values[np.argsort(-b.t0_ns.values)][:5],0))
