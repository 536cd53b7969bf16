// The static quiz's click handler. %(uid)s is replaced by the quiz's element id.
(function(){
var id="%(uid)s", box=document.getElementById(id), d=JSON.parse(document.getElementById(id+"-data").textContent);
var fb=document.getElementById(id+"-fb"), ex=document.getElementById(id+"-ex"), ans=ex.querySelector(".wtc-answer");
function esc(t){return t.replace(/&/g,"&amp;").replace(/</g,"&lt;").replace(/>/g,"&gt;").replace(/"/g,"&quot;").replace(/'/g,"&#x27;");}
function show(ok, text){fb.innerHTML='<span class="'+(ok?'wtc-right':'wtc-wrong')+'">'+(ok?'\u2714 ':'\u2718 ')+text+'</span>';
 fb.setAttribute("data-correct", ok?"true":"false"); if(ok){explain();}}
// A wrong answer gets its hint only; the answer and explanation wait for a right answer or "Show answer".
// After a right answer the verdict line already says the answer (and why), so only the explanation opens.
function explain(){if(box.getAttribute("data-revealed")==="true"){return;}
 ans.hidden=true; if(ex.children.length>1){ex.hidden=false;}}
function reveal(){ans.hidden=false; ex.hidden=false; box.setAttribute("data-revealed","true");}
box.querySelector("button.wtc-reveal").addEventListener("click", reveal);
box.querySelector("button.wtc-check").addEventListener("click", function(){
 if(d.kind==="single"){var s=box.querySelector('input[type=radio]:checked');
   if(!s){fb.textContent="Choose an answer first.";return;} var v=d.verdicts[parseInt(s.value,10)]; show(v[0],v[1]);}
 else if(d.kind==="multiple"){var m=0; box.querySelectorAll('input[type=checkbox]').forEach(function(c){if(c.checked){m|=1<<parseInt(c.value,10);}});
   var v=d.verdicts[m]; show(v[0],v[1]);}
 else {var raw=document.getElementById(id+"-x").value.trim().replace(/,/g,""), x=Number(raw);
   if(raw===""||!isFinite(x)){fb.textContent=d.messages.nan;fb.setAttribute("data-correct","false");return;}
   var shown=esc(document.getElementById(id+"-x").value.trim()), slack=1e-12*Math.max(1,Math.abs(d.answer));
   if(Math.abs(x-d.answer)<=d.tolerance+slack){show(true,d.messages.right.replace("{x}",shown));}
   else{show(false,d.messages[x>d.answer?"high":"low"].replace("{x}",shown));}}
});})();
