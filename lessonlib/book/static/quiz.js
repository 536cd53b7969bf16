// The static quiz's script. %(uid)s is replaced by the quiz's element id.
// The page holds no answer in plain form: verdicts, feedback, the answer and the explanation come
// base64-encoded in the "-data" script element, which only this script decodes. Where the script
// does not run (an untrusted notebook, a plain viewer), the reader sees the question, the choices
// and a "run this cell" line, never an answer (JupyterLab strips `hidden` from untrusted outputs).
(function(){
var id="%(uid)s", box=document.getElementById(id), raw=document.getElementById(id+"-data").textContent.trim();
var bytes=atob(raw), u=new Uint8Array(bytes.length); for(var i=0;i<bytes.length;i++){u[i]=bytes.charCodeAt(i);}
var d=JSON.parse(new TextDecoder().decode(u));
var off=box.querySelector(".wtc-noscript"); if(off){off.remove();}
function el(tag, cls, html){var e=document.createElement(tag); if(cls){e.className=cls;} if(html){e.innerHTML=html;} return e;}
function button(cls, label){var b=el("button", cls); b.type="button"; b.textContent=label; return b;}
var row=el("div"), fb=el("div","wtc-feedback"), ex=el("div","wtc-explanation");
fb.id=id+"-fb"; fb.setAttribute("aria-live","polite"); ex.id=id+"-ex"; ex.hidden=true;
box.insertBefore(ex, box.querySelector("script")); box.insertBefore(fb, ex); box.insertBefore(row, fb);
// A prediction: one button that reveals its answer.
if(d.kind==="prediction"){var r=button("wtc-reveal","Reveal answer"); row.appendChild(r);
 r.addEventListener("click", function(){if(!ex.firstChild){ex.appendChild(el("div","",d.answer));} ex.hidden=false;
  r.setAttribute("aria-expanded","true");}); r.setAttribute("aria-expanded","false"); return;}
var check=button("wtc-check","Check"), rev=button("wtc-reveal","Show answer"); row.appendChild(check); row.appendChild(rev);
function esc(t){return t.replace(/&/g,"&amp;").replace(/</g,"&lt;").replace(/>/g,"&gt;").replace(/"/g,"&quot;").replace(/'/g,"&#x27;");}
function show(ok, text){fb.innerHTML='<span class="'+(ok?'wtc-right':'wtc-wrong')+'">'+(ok?'\u2714 ':'\u2718 ')+text+'</span>';
 fb.setAttribute("data-correct", ok?"true":"false"); if(ok){explain();}}
// A wrong answer gets its hint only; the answer and explanation wait for a right answer or "Show answer".
// After a right answer the verdict line already says the answer (and why), so only the explanation opens.
function explain(){if(box.getAttribute("data-revealed")==="true"||!d.explanation){return;}
 ex.innerHTML='<div>'+d.explanation+'</div>'; ex.hidden=false;}
function reveal(){ex.innerHTML='<div class="wtc-answer">'+d.answer+'</div>'+(d.explanation?'<div>'+d.explanation+'</div>':'');
 ex.hidden=false; box.setAttribute("data-revealed","true");}
rev.addEventListener("click", reveal);
var typed=document.getElementById(id+"-x");
if(typed){typed.addEventListener("keydown", function(e){if(e.key==="Enter"&&!e.shiftKey){e.preventDefault(); check.click();}});}
check.addEventListener("click", function(){
 if(d.kind==="single"){var s=box.querySelector('input[type=radio]:checked');
   if(!s){fb.textContent="Choose an answer first.";return;} var v=d.verdicts[parseInt(s.value,10)]; show(v[0],v[1]);}
 else if(d.kind==="multiple"){var m=0; box.querySelectorAll('input[type=checkbox]').forEach(function(c){if(c.checked){m|=1<<parseInt(c.value,10);}});
   var v=d.verdicts[m]; show(v[0],v[1]);}
 else {var raw=document.getElementById(id+"-x").value.trim().replace(/,/g,""), x=Number(raw);
   if(raw===""||!isFinite(x)){fb.textContent=d.messages.nan;fb.setAttribute("data-correct","false");return;}
   var shown=esc(document.getElementById(id+"-x").value.trim()), slack=1e-12*Math.max(1,Math.abs(d.answer_value));
   if(Math.abs(x-d.answer_value)<=d.tolerance+slack){show(true,d.messages.right.replace("{x}",shown));}
   else{show(false,d.messages[x>d.answer_value?"high":"low"].replace("{x}",shown));}}
});})();
